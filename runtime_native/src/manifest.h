// The few manifest.json fields the native runtime needs, read and checked. The format is
// defined once, in Python (hyflash/bundle); this reader takes the fields an ExecuTorch
// bundle's runtime binds and refuses anything else with one line that names the fix.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyflash {

constexpr int64_t kDynamic = -1;  // a dim the manifest names (e.g. "sequence_length")

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // kDynamic for a named (dynamic) dim
  std::string dtype;           // "float32", "int64", ...
};

// One method of the program and its positional I/O as exported.
struct MethodContract {
  std::string role;    // forward, target, drafter_step, drafter_commit
  std::string method;  // the program's method name
  std::vector<TensorSpec> inputs, outputs;
  int64_t rows = 0;    // commit_rows: feature rows per call (target: the feature ring's)
};

struct Manifest {
  std::string folder;
  std::string program_file;  // the .pte, relative to folder
  std::string quant_recipe;
  int64_t vocab_size = 0, max_seq_len = 0, feature_size = 0, block_size = 0;
  std::vector<int64_t> eos_ids;
  std::vector<TensorSpec> state;  // drafter state: name, shape, dtype
  std::map<std::string, MethodContract> methods;  // by role

  const MethodContract& role(const std::string& name) const;
};

// Reads folder/manifest.json of an ExecuTorch bundle and checks that every file it lists
// is present with its recorded size (the Python reader also checks sha256).
Manifest read_manifest(const std::string& folder);

}  // namespace hyflash
