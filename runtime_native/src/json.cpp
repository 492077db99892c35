// Recursive-descent JSON reader (RFC 8259) with one-line errors. Depth is capped so a
// hostile file cannot overflow the stack.
#include "json.h"

#include <cmath>
#include <cstdlib>

#include "error.h"

namespace hyflash::json {
namespace {

constexpr int kMaxDepth = 64;
const char* const kReexport =
    "the bundle is damaged; re-export it with `hyflash export --backend executorch`";

class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  Value document() {
    Value v = value(0);
    space();
    if (i_ != s_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  const std::string& s_;
  const std::string& source_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(source_ + " is not valid JSON (" + what + " at byte " + std::to_string(i_) +
                "): " + kReexport);
  }

  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' ||
                              s_[i_] == '\t'))
      ++i_;
  }

  bool eat(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }

  bool word(const char* w) {
    size_t n = std::char_traits<char>::length(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    Value v;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Value::Kind::Object;
      if (eat('}')) return v;
      do {
        space();
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Value::Kind::Array;
      if (eat(']')) return v;
      do {
        v.items.push_back(value(depth + 1));
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = string();
    } else if (word("true")) {
      v.kind = Value::Kind::Bool;
      v.boolean = true;
    } else if (word("false")) {
      v.kind = Value::Kind::Bool;
    } else if (word("null")) {
      v.kind = Value::Kind::Null;
    } else {
      v.kind = Value::Kind::Number;
      v.number = number();
    }
    return v;
  }

  double number() {
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    auto digits = [&] {
      size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > from;
    };
    if (!digits()) fail("expected a value");
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) fail("expected digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) fail("expected an exponent");
    }
    return std::strtod(s_.substr(start, i_ - start).c_str(), nullptr);
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

}  // namespace

const Value* Value::find(const std::string& key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

Value parse(const std::string& text, const std::string& source) {
  return Parser(text, source).document();
}

void Reader::fail(const std::string& problem) const {
  throw Error(source_ + ": " + (path_.empty() ? "the document" : path_) + " " + problem +
              ": " + kReexport);
}

bool Reader::has(const std::string& key) const {
  return value_->is_object() && value_->find(key) != nullptr;
}

Reader Reader::get(const std::string& key) const {
  if (!value_->is_object()) fail("must be an object");
  const Value* v = value_->find(key);
  std::string path = path_.empty() ? key : path_ + "." + key;
  if (v == nullptr) Reader(*value_, source_, path).fail("is missing");
  return Reader(*v, source_, path);
}

std::vector<Reader> Reader::elements() const {
  if (value_->kind != Value::Kind::Array) fail("must be an array");
  std::vector<Reader> out;
  for (size_t i = 0; i < value_->items.size(); ++i)
    out.emplace_back(value_->items[i], source_, path_ + "[" + std::to_string(i) + "]");
  return out;
}

std::vector<std::pair<std::string, Reader>> Reader::entries() const {
  if (!value_->is_object()) fail("must be an object");
  std::vector<std::pair<std::string, Reader>> out;
  for (const auto& [k, v] : value_->members)
    out.emplace_back(k, Reader(v, source_, path_.empty() ? k : path_ + "." + k));
  return out;
}

std::string Reader::str() const {
  if (value_->kind != Value::Kind::String) fail("must be a string");
  return value_->text;
}

int64_t Reader::integer(int64_t minimum) const {
  double x = value_->number;
  if (value_->kind != Value::Kind::Number || std::floor(x) != x || std::fabs(x) > 9.0e15)
    fail("must be an integer");
  if (x < double(minimum)) fail("must be >= " + std::to_string(minimum));
  return int64_t(x);
}

std::vector<int64_t> Reader::integers(int64_t minimum) const {
  std::vector<int64_t> out;
  for (const Reader& e : elements()) out.push_back(e.integer(minimum));
  return out;
}

}  // namespace hyflash::json
