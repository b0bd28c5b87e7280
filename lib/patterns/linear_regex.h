// Regular expressions matched in time linear in the subject (a Thompson NFA run in lock step, as RE2
// and Go's regexp do), for the patterns that come from users and from checkpoints' own metadata
// (a backtracking matcher hung for minutes on a catastrophic pattern such as
// `(a+)+$`). Syntax: the part of Python's `re` that patterns use — literals, `.`, classes `[...]` with
// ranges and negation, `\d \w \s \D \W \S`, escapes, groups `(...)` `(?:...)` `(?P<name>...)`,
// alternation, `* + ? {m} {m,} {m,n} {,n}` and their lazy forms, `^ $ \A \Z`. What needs
// backtracking (backreferences, lookaround, possessive quantifiers, inline flags, `\b`) is refused
// with a message naming it, never matched differently.
#pragma once
#include <bitset>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ucpkit::patterns {

// A pattern that cannot be compiled (PatternSet::from_json adds the file that holds it).
class PatternError : public Error {
 public:
  using Error::Error;
};

class LinearRegex {
 public:
  // Throws PatternError("bad pattern '<source, escaped, at most 80 bytes>': <why>") for a syntax error, an unsupported construct or a
  // program over kMaxProgram instructions (counted repeats are expanded).
  explicit LinearRegex(const std::string& source);
  // Python's re.match: the match starts at the first character and may end anywhere.
  bool match_prefix(std::string_view subject) const;

  static constexpr size_t kMaxProgram = 20000;

  enum class Op : unsigned char { Class, Split, Jump, Match, Begin, End, EndStrict };
  struct Inst {
    Op op = Op::Match;
    int x = 0, y = 0;  // Split: both targets; Jump: x; Class: index into classes_
  };

 private:
  std::vector<Inst> program_;
  std::vector<std::bitset<256>> classes_;
};

}  // namespace ucpkit::patterns
