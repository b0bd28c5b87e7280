// Linear-time regular expressions: parse (Python re syntax subset) -> tree -> Thompson program -> a
// lock-step simulation of every thread at once (Pike VM without captures: only "does it match").
#include "patterns/linear_regex.h"

#include <cctype>
#include <cstdint>
#include <memory>

#include "core/error.h"

namespace ucpkit::patterns {
namespace {

using CharSet = std::bitset<256>;

struct Node {
  enum Kind { Set, Concat, Alt, Repeat, Begin, End, EndStrict } kind = Concat;
  CharSet set;                                  // Set
  std::vector<std::unique_ptr<Node>> children;  // Concat, Alt, Repeat (one child)
  int min = 0, max = -1;                        // Repeat; max -1: unbounded
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make(Node::Kind k) {
  auto n = std::make_unique<Node>();
  n->kind = k;
  return n;
}

CharSet range(int lo, int hi) {
  CharSet s;
  for (int c = lo; c <= hi; ++c) s.set(c);
  return s;
}
CharSet digits() { return range('0', '9'); }
CharSet word() { return range('a', 'z') | range('A', 'Z') | digits() | range('_', '_'); }
CharSet space() {
  CharSet s;
  for (char c : std::string(" \t\n\r\f\v")) s.set(static_cast<unsigned char>(c));
  return s;
}

class Parser {
 public:
  explicit Parser(const std::string& src) : s_(src) {}

  NodePtr parse() {
    NodePtr n = alternation();
    if (i_ < s_.size()) bad(s_[i_] == ')' ? "unbalanced parenthesis" : "unexpected character");
    return n;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    throw PatternError("bad pattern '" + escaped_brief(s_) + "': " + why + " at position " + std::to_string(i_));
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return s_[i_]; }

  NodePtr alternation() {
    NodePtr first = concatenation();
    if (at_end() || peek() != '|') return first;
    NodePtr alt = make(Node::Alt);
    alt->children.push_back(std::move(first));
    while (!at_end() && peek() == '|') {
      ++i_;
      alt->children.push_back(concatenation());
    }
    return alt;
  }

  NodePtr concatenation() {
    NodePtr cat = make(Node::Concat);
    while (!at_end() && peek() != '|' && peek() != ')') cat->children.push_back(quantified(atom()));
    return cat;
  }

  // `{m}`, `{m,}`, `{m,n}`, `{,n}`; anything else after `{` is a literal brace, as in Python.
  bool counted(int& min, int& max) {
    size_t j = i_ + 1;
    auto number = [&](int& out) {
      size_t start = j;
      long v = 0;
      while (j < s_.size() && s_[j] >= '0' && s_[j] <= '9' && v < 100000) v = v * 10 + (s_[j++] - '0');
      out = static_cast<int>(v);
      return j > start;
    };
    int lo = 0, hi = -1;
    const bool has_lo = number(lo);
    if (j < s_.size() && s_[j] == '}') {
      if (!has_lo) return false;
      hi = lo;
    } else if (j < s_.size() && s_[j] == ',') {
      ++j;
      if (!number(hi)) hi = -1;
      if (j >= s_.size() || s_[j] != '}') return false;
    } else {
      return false;
    }
    if (hi >= 0 && hi < lo) bad("min repeat greater than max repeat");
    min = lo;
    max = hi;
    i_ = j + 1;
    return true;
  }

  NodePtr quantified(NodePtr atom) {
    while (!at_end()) {
      int min = 0, max = -1;
      const char c = peek();
      if (c == '*') {
        ++i_;
      } else if (c == '+') {
        min = 1, ++i_;
      } else if (c == '?') {
        max = 1, ++i_;
      } else if (c != '{' || !counted(min, max)) {
        break;
      }
      if (atom->kind == Node::Begin || atom->kind == Node::End || atom->kind == Node::EndStrict) bad("nothing to repeat");
      if (!at_end() && peek() == '?') ++i_;  // lazy: the same language, and only "matches or not" counts here
      else if (!at_end() && peek() == '+') bad("possessive quantifiers are not supported");
      NodePtr r = make(Node::Repeat);
      r->min = min;
      r->max = max;
      r->children.push_back(std::move(atom));
      atom = std::move(r);
    }
    return atom;
  }

  NodePtr set_node(const CharSet& s) {
    NodePtr n = make(Node::Set);
    n->set = s;
    return n;
  }

  NodePtr group() {
    if (s_.compare(i_, 2, "?:") == 0) {
      i_ += 2;
    } else if (s_.compare(i_, 3, "?P<") == 0) {
      const size_t close = s_.find('>', i_);
      if (close == std::string::npos) bad("unterminated group name");
      i_ = close + 1;
    } else if (!at_end() && peek() == '?') {
      bad("lookaround, backreferences and inline flags are not supported (patterns match in linear time)");
    }
    NodePtr inner = alternation();
    if (at_end() || peek() != ')') bad("missing ), unterminated subpattern");
    ++i_;
    return inner;
  }

  NodePtr atom() {
    const char c = s_[i_++];
    switch (c) {
      case '(': return group();
      case '[': return set_node(bracket());
      case '.': return set_node(~CharSet().set('\n'));
      case '^': return make(Node::Begin);
      case '$': return make(Node::End);
      case '\\': return escape_atom();
      case '*': case '+': case '?': bad("nothing to repeat");
      default: return set_node(CharSet().set(static_cast<unsigned char>(c)));
    }
  }

  NodePtr escape_atom() {
    if (at_end()) bad("bad escape (end of pattern)");
    const char c = peek();
    if (c == 'A') return ++i_, make(Node::Begin);
    if (c == 'Z') return ++i_, make(Node::EndStrict);
    if (c == 'b' || c == 'B') bad("word boundaries (\\b, \\B) are not supported");
    if (c >= '1' && c <= '9') bad("backreferences are not supported");
    return set_node(escape_set());
  }

  // The set of one escape (after the backslash), inside or outside a class.
  CharSet escape_set() {
    if (at_end()) bad("bad escape (end of pattern)");
    const char c = s_[i_++];
    switch (c) {
      case 'd': return digits();
      case 'D': return ~digits();
      case 'w': return word();
      case 'W': return ~word();
      case 's': return space();
      case 'S': return ~space();
      case 'n': return CharSet().set('\n');
      case 't': return CharSet().set('\t');
      case 'r': return CharSet().set('\r');
      case 'f': return CharSet().set('\f');
      case 'v': return CharSet().set('\v');
      case '0': return CharSet().set(0);
      case 'x': {
        if (i_ + 2 > s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_])) ||
            !std::isxdigit(static_cast<unsigned char>(s_[i_ + 1])))
          bad("bad \\x escape");
        const int v = std::stoi(s_.substr(i_, 2), nullptr, 16);
        i_ += 2;
        return CharSet().set(v);
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) bad(std::string("bad escape \\") + c);
        return CharSet().set(static_cast<unsigned char>(c));
    }
  }

  CharSet bracket() {
    CharSet set;
    const bool negate = !at_end() && peek() == '^';
    if (negate) ++i_;
    bool first = true;
    while (true) {
      if (at_end()) bad("unterminated character set");
      if (peek() == ']' && !first) break;
      first = false;
      int lo;
      if (peek() == '\\') {
        ++i_;
        const CharSet e = escape_set();
        if (e.count() != 1) {  // \d, \w, ...: a set, not a range end
          set |= e;
          continue;
        }
        lo = static_cast<int>(e._Find_first());
      } else {
        lo = static_cast<unsigned char>(s_[i_++]);
      }
      if (i_ + 1 < s_.size() && peek() == '-' && s_[i_ + 1] != ']') {
        ++i_;
        int hi;
        if (peek() == '\\') {
          ++i_;
          const CharSet e = escape_set();
          if (e.count() != 1) bad("bad character range");
          hi = static_cast<int>(e._Find_first());
        } else {
          hi = static_cast<unsigned char>(s_[i_++]);
        }
        if (hi < lo) bad("bad character range");
        set |= range(lo, hi);
      } else {
        set.set(lo);
      }
    }
    ++i_;  // ']'
    return negate ? ~set : set;
  }

  const std::string& s_;
  size_t i_ = 0;
};

using Inst = LinearRegex::Inst;
using Op = LinearRegex::Op;

class Compiler {
 public:
  Compiler(std::vector<Inst>& program, std::vector<CharSet>& classes, const std::string& source)
      : p_(program), classes_(classes), source_(source) {}

  void emit(const Node& n) {
    if (p_.size() > LinearRegex::kMaxProgram)
      throw PatternError("bad pattern '" + escaped_brief(source_) + "': too large once its counted repeats are expanded");
    switch (n.kind) {
      case Node::Set:
        classes_.push_back(n.set);
        push({Op::Class, static_cast<int>(classes_.size() - 1), 0});
        break;
      case Node::Begin: push({Op::Begin, 0, 0}); break;
      case Node::End: push({Op::End, 0, 0}); break;
      case Node::EndStrict: push({Op::EndStrict, 0, 0}); break;
      case Node::Concat:
        for (const auto& c : n.children) emit(*c);
        break;
      case Node::Alt: alternation(n); break;
      case Node::Repeat: repeat(n); break;
    }
  }

 private:
  int push(Inst i) {
    p_.push_back(i);
    return static_cast<int>(p_.size() - 1);
  }
  int here() const { return static_cast<int>(p_.size()); }

  void alternation(const Node& n) {
    std::vector<int> jumps;
    for (size_t k = 0; k + 1 < n.children.size(); ++k) {
      const int split = push({Op::Split, 0, 0});
      p_[split].x = here();
      emit(*n.children[k]);
      jumps.push_back(push({Op::Jump, 0, 0}));
      p_[split].y = here();
    }
    emit(*n.children.back());
    for (int j : jumps) p_[j].x = here();
  }

  void repeat(const Node& n) {
    const Node& body = *n.children[0];
    for (int k = 0; k < n.min; ++k) emit(body);
    if (n.max < 0) {  // L: split body, out; body; jump L
      const int split = push({Op::Split, 0, 0});
      p_[split].x = here();
      emit(body);
      push({Op::Jump, split, 0});
      p_[split].y = here();
      return;
    }
    std::vector<int> splits;
    for (int k = n.min; k < n.max; ++k) {  // each optional copy: split body, out
      const int split = push({Op::Split, 0, 0});
      p_[split].x = here();
      splits.push_back(split);
      emit(body);
    }
    for (int s : splits) p_[s].y = here();
  }

  std::vector<Inst>& p_;
  std::vector<CharSet>& classes_;
  const std::string& source_;
};

}  // namespace

LinearRegex::LinearRegex(const std::string& source) {
  const NodePtr tree = Parser(source).parse();
  Compiler(program_, classes_, source).emit(*tree);
  program_.push_back({Op::Match, 0, 0});
}

bool LinearRegex::match_prefix(std::string_view s) const {
  const size_t n = s.size();
  std::vector<int> current, next, stack;
  std::vector<size_t> seen(program_.size(), SIZE_MAX);  // the step at which a pc was last added
  // Adds pc and everything reachable from it without reading a character, at position `pos`.
  auto add = [&](std::vector<int>& list, int pc0, size_t pos, size_t step) -> bool {
    stack.assign(1, pc0);
    while (!stack.empty()) {
      const int pc = stack.back();
      stack.pop_back();
      if (seen[pc] == step) continue;
      seen[pc] = step;
      const Inst& in = program_[pc];
      switch (in.op) {
        case Op::Match: return true;
        case Op::Jump: stack.push_back(in.x); break;
        case Op::Split: stack.push_back(in.y), stack.push_back(in.x); break;
        case Op::Begin: if (pos == 0) stack.push_back(pc + 1); break;
        case Op::End: if (pos == n || (pos + 1 == n && s[pos] == '\n')) stack.push_back(pc + 1); break;
        case Op::EndStrict: if (pos == n) stack.push_back(pc + 1); break;
        case Op::Class: list.push_back(pc); break;
      }
    }
    return false;
  };
  if (add(current, 0, 0, 0)) return true;
  for (size_t pos = 0; pos < n && !current.empty(); ++pos) {
    next.clear();
    const auto c = static_cast<unsigned char>(s[pos]);
    for (int pc : current)
      if (classes_[program_[pc].x].test(c) && add(next, pc + 1, pos + 1, pos + 1)) return true;
    current.swap(next);
  }
  return false;
}

}  // namespace ucpkit::patterns
