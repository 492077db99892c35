// A minimal JSON reader: enough for manifest.json (objects, arrays, strings with \u
// escapes, numbers, true / false / null). Hand-written because the ExecuTorch wheel ships
// no JSON library and the project vendors none; values are read, never written.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hyflash::json {

class Value {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  std::string text;  // a string's value (UTF-8)
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;  // in file order

  bool is_object() const { return kind == Kind::Object; }
  // The member named key, or nullptr.
  const Value* find(const std::string& key) const;
};

// Parses text; throws hyflash::Error("<source> is not valid JSON (<what> at byte N)").
Value parse(const std::string& text, const std::string& source);

// Typed access to a value that names the field of any problem, e.g.
// "manifest.json: models.forward.inputs[0].dtype must be a string: re-export the bundle".
class Reader {
 public:
  Reader(const Value& value, std::string source, std::string path = "")
      : value_(&value), source_(std::move(source)), path_(std::move(path)) {}

  bool has(const std::string& key) const;
  Reader get(const std::string& key) const;  // a member that must exist
  std::vector<Reader> elements() const;      // an array's elements
  std::vector<std::pair<std::string, Reader>> entries() const;  // an object's members
  const Value& value() const { return *value_; }
  std::string str() const;
  int64_t integer(int64_t minimum) const;
  std::vector<int64_t> integers(int64_t minimum) const;
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& problem) const;

 private:
  const Value* value_;
  std::string source_;
  std::string path_;
};

}  // namespace hyflash::json
