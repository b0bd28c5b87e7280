// Streaming plan reader (see plan_scan.h).
#include "placement/plan_scan.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/json_input.h"
#include "core/mapped_file.h"

namespace ucpkit::placement {
namespace {

// Anything outside the plain form: the caller parses the whole file instead.
struct Fallback {};

// Nesting this reader accepts, well inside what the full parse accepts (kMaxJsonDepth), so that a
// file it reads is never one the full parse would refuse for its depth.
constexpr int kDepth = kMaxJsonDepth - 4;

// Reads the file through its map: read() into a buffer copied every byte once more, and at 1,024 nodes
// (1.4 GB of plan) that copy was a sixth of a re-placement's CPU. Pages read are dropped as it goes
// (release), so the resident set stays small.
class Reader {
 public:
  explicit Reader(const MappedFile& file)
      : file_(file), buf_(reinterpret_cast<const char*>(file.data())), end_(file.size()) {
    prefault();
  }

  // The next byte, -1 at the end of the file. The per-byte calls are inlined (the reader's time is
  // theirs: 200 MB of log2phy skipped at 1,024 nodes); captures are out of line.
  [[gnu::always_inline]] int peek() {
    if (pos_ == end_) return -1;
    return static_cast<unsigned char>(buf_[pos_]);
  }
  [[gnu::always_inline]] int get() {
    if (pos_ == end_) return -1;
    const char c = buf_[pos_++];
    if (capture_) [[unlikely]]
      keep(c);
    return static_cast<unsigned char>(c);
  }
  [[gnu::always_inline]] void expect(char c) {
    if (get() != static_cast<unsigned char>(c)) throw Fallback{};
  }
  // JSON whitespace (RFC 8259: space, tab, line feed, carriage return).
  [[gnu::always_inline]] void ws() {
    for (;;) {
      if (pos_ == end_) return;
      const char c = buf_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') [[likely]]
        return;
      ++pos_;
      if (capture_) [[unlikely]]
        keep(c);
    }
  }
  bool at_end() {
    ws();
    return peek() < 0;
  }

  // A string of printable ASCII without escapes (anything else falls back), into `out` when given.
  void string(std::string* out) {
    expect('"');
    for (;;) {
      const int c = get();
      if (c == '"') return;
      if (c < 0x20 || c >= 0x7f || c == '\\') throw Fallback{};  // also the end of the file (-1)
      if (out) out->push_back(static_cast<char>(c));
    }
  }

  // Any JSON value, validated and dropped (or appended to the capture).
  void value(int depth) {
    ws();
    const int c = peek();
    if (c == '{') return object(depth + 1);
    if (c == '[') return array(depth + 1);
    if (c == '"') return string(nullptr);
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (c == 't') return literal("true");
    if (c == 'f') return literal("false");
    if (c == 'n') return literal("null");
    throw Fallback{};
  }

  // A list of non-negative integers that fit an int (a phy2log).
  void int_list(std::vector<int>& out) {
    ws();
    expect('[');
    ws();
    if (peek() == ']') {
      get();
      return;
    }
    for (;;) {
      ws();
      int c = get();
      if (c < '0' || c > '9') throw Fallback{};
      long long v = c - '0';
      if (c == '0') {
        if (const int d = peek(); d >= '0' && d <= '9') throw Fallback{};  // a leading zero is not JSON
      } else {
        for (int d = peek(); d >= '0' && d <= '9'; d = peek()) {
          get();
          v = v * 10 + (d - '0');
          if (v > INT_MAX) throw Fallback{};
        }
      }
      out.push_back(static_cast<int>(v));
      ws();
      c = get();
      if (c == ']') return;
      if (c != ',') throw Fallback{};
    }
  }

  // The pages before the position leave the resident set (drop_pages gathers them into 32 MiB).
  void release() {
    file_.drop_pages({reinterpret_cast<const uint8_t*>(buf_) + released_, pos_ - released_});
    released_ = pos_;
    prefault();
  }

  // The next kAhead bytes mapped in one call while less than half of that is mapped ahead (a page fault per
  // 64 KB otherwise: the file is 1.4 GB at 1,024 nodes).
  void prefault() {
    if (pos_ + kAhead / 2 <= prefaulted_) return;
    file_.prefault(prefaulted_, pos_ + kAhead - prefaulted_);
    prefaulted_ = pos_ + kAhead;
  }

  std::string* capture_ = nullptr;

 private:
  [[gnu::noinline]] void keep(char c) { capture_->push_back(c); }

  void object(int depth) {
    if (depth > kDepth) throw Fallback{};
    expect('{');
    ws();
    if (peek() == '}') {
      get();
      return;
    }
    for (;;) {
      ws();
      string(nullptr);
      ws();
      expect(':');
      value(depth);
      ws();
      const int c = get();
      if (c == '}') return;
      if (c != ',') throw Fallback{};
    }
  }

  void array(int depth) {
    if (depth > kDepth) throw Fallback{};
    expect('[');
    ws();
    if (peek() == ']') {
      get();
      return;
    }
    for (;;) {
      if (!capture_) skip_int_run();
      value(depth);
      ws();
      const int c = get();
      if (c == ']') return;
      if (c != ',') throw Fallback{};
    }
  }

  // Consumes elements of the plain form "-?[0-9]+," (no whitespace, an integer JSON allows) from the
  // buffer as long as they come whole; anything else is left to value(). Most of a plan is such runs.
  void skip_int_run() {
    const char* const base = buf_;
    const char* const e = base + end_;
    const char* p = base + pos_;
    for (;;) {
      p = skip_padding(p, e);
      const char* q = p;
      if (q < e && *q == '-') ++q;
      if (q >= e) break;
      if (*q == '0') {
        ++q;
      } else if (*q >= '1' && *q <= '9') {
        const char* first = q++;
        while (q < e && *q >= '0' && *q <= '9') ++q;
        if (q - first > 300) break;
      } else {
        break;
      }
      if (q >= e || *q != ',') break;
      p = q + 1;
    }
    pos_ = static_cast<size_t>(p - base);
  }

  // log2phy's padding ("-1," repeated; 69% of a plan at 1,024 nodes) sixteen elements at a time, as six
  // 8-byte words (the pattern's period is 3 bytes, so 24 bytes are three fixed words): a memcmp per
  // eight elements made this loop most of a 1,024-node re-placement's plan read.
  static const char* skip_padding(const char* p, const char* e) {
    static constexpr char kPadding[] = "-1,-1,-1,-1,-1,-1,-1,-1,";
    uint64_t w[3];
    std::memcpy(w, kPadding, sizeof w);
    auto word = [](const char* at) {
      uint64_t v;
      std::memcpy(&v, at, sizeof v);
      return v;
    };
    while (e - p >= 48 && (((word(p) ^ w[0]) | (word(p + 8) ^ w[1]) | (word(p + 16) ^ w[2]) | (word(p + 24) ^ w[0]) |
                            (word(p + 32) ^ w[1]) | (word(p + 40) ^ w[2])) == 0))
      p += 48;
    while (e - p >= 24 && (((word(p) ^ w[0]) | (word(p + 8) ^ w[1]) | (word(p + 16) ^ w[2])) == 0)) p += 24;
    return p;
  }

  [[gnu::always_inline]] int digits() {
    int n = 0;
    for (int c = peek(); c >= '0' && c <= '9'; c = peek(), ++n) get();
    return n;
  }

  // RFC 8259 number; exponents of three digits and integers of hundreds fall back (the full parse
  // refuses a number that overflows a double).
  [[gnu::always_inline]] void number() {
    int c = get();
    if (c == '-') c = get();
    if (c >= '1' && c <= '9') {
      if (digits() > 300) throw Fallback{};
    } else if (c != '0') {
      throw Fallback{};
    }
    if (peek() == '.') {
      get();
      if (digits() == 0) throw Fallback{};
    }
    if (const int e = peek(); e == 'e' || e == 'E') {
      get();
      if (const int s = peek(); s == '+' || s == '-') get();
      const int n = digits();
      if (n == 0 || n > 2) throw Fallback{};
    }
  }

  void literal(const char* word) {
    for (const char* p = word; *p; ++p) expect(*p);
  }

  const MappedFile& file_;
  const char* buf_;
  size_t pos_ = 0, end_, released_ = 0, prefaulted_ = 0;
  static constexpr size_t kAhead = size_t{64} << 20;
};

void read_layers(Reader& r, std::vector<std::vector<int>>& out) {
  r.ws();
  r.expect('[');
  r.ws();
  if (r.peek() == ']') throw Fallback{};  // no layers: the full parse says so
  size_t size = 0;
  for (;;) {
    r.ws();
    r.expect('{');
    std::vector<int> p2l;
    p2l.reserve(size);
    bool got = false;
    for (;;) {
      r.ws();
      std::string key;
      r.string(&key);
      r.ws();
      r.expect(':');
      if (key == "phy2log") {
        if (got) throw Fallback{};
        got = true;
        r.int_list(p2l);
      } else {
        r.value(3);
      }
      r.ws();
      const int c = r.get();
      if (c == '}') break;
      if (c != ',') throw Fallback{};
    }
    if (!got) throw Fallback{};
    size = p2l.size();
    out.push_back(std::move(p2l));
    r.release();
    r.ws();
    const int c = r.get();
    if (c == ']') return;
    if (c != ',') throw Fallback{};
  }
}

}  // namespace

std::optional<ScannedPlan> scan_plan_file(const std::string& path, const std::vector<std::string>& head_keys) {
  try {
    // A FIFO or device is refused before it can block; that and any other error go to the full reader,
    // which names them.
    const std::shared_ptr<const MappedFile> file = MappedFile::open(path);
    Reader r(*file);
    ScannedPlan out;
    r.ws();
    r.expect('{');
    r.ws();
    if (r.peek() == '}') throw Fallback{};
    for (;;) {
      r.ws();
      std::string key;
      r.string(&key);
      r.ws();
      r.expect(':');
      if (key == "layers") {
        if (out.has_layers) throw Fallback{};
        out.has_layers = true;
        read_layers(r, out.phy2log);
      } else if (std::find(head_keys.begin(), head_keys.end(), key) != head_keys.end()) {
        if (out.head.contains(key)) throw Fallback{};
        std::string raw;
        r.ws();
        r.capture_ = &raw;
        r.value(1);
        r.capture_ = nullptr;
        out.head[key] = nlohmann::json::parse(raw);
      } else {
        r.value(1);
      }
      r.ws();
      const int c = r.get();
      if (c == '}') break;
      if (c != ',') throw Fallback{};
    }
    if (!r.at_end()) throw Fallback{};
    return out;
  } catch (const Fallback&) {
    return std::nullopt;
  } catch (const std::exception&) {  // e.g. out of memory: the full parse reports it
    return std::nullopt;
  }
}

}  // namespace ucpkit::placement
