// One exception type for every problem a user can fix: a one-line message that names the
// problem and the fix (the C++ face of hyflash.errors.HyflashError). The CLI prints it
// after "hyflash-run: error: " and exits 2; the JNI layer turns it into a Java exception.
#pragma once

#include <stdexcept>
#include <string>

namespace hyflash {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace hyflash
