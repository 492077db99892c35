// Reads an ExecuTorch bundle's manifest.json (format 2, hyflash/bundle/__init__.py).
#include "manifest.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "error.h"
#include "json.h"

namespace hyflash {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kFormatVersion = 2;  // hyflash.bundle.FORMAT_VERSION this reader knows
const char* const kExport = "`hyflash export --backend executorch`";
const char* const kRoles[] = {"forward", "target", "drafter_step", "drafter_commit"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw Error("cannot read " + path.string() + ": check its permissions");
  return text.str();
}

std::vector<int64_t> shape_of(const json::Reader& r) {
  std::vector<int64_t> out;
  for (const json::Reader& d : r.elements())
    out.push_back(d.value().kind == json::Value::Kind::String ? kDynamic : d.integer(0));
  return out;
}

std::vector<TensorSpec> specs_of(const json::Reader& r) {
  std::vector<TensorSpec> out;
  for (const json::Reader& s : r.elements())
    out.push_back({s.get("name").str(), shape_of(s.get("shape")), s.get("dtype").str()});
  return out;
}

}  // namespace

const MethodContract& Manifest::role(const std::string& name) const {
  auto it = methods.find(name);
  if (it == methods.end())
    throw Error("bundle " + folder + " has no " + name + " method: re-export it with " +
                kExport);
  return it->second;
}

Manifest read_manifest(const std::string& folder) {
  fs::path dir(folder);
  if (!fs::is_directory(dir))
    throw Error("no bundle folder at " + folder + ": pass the folder " + kExport + " wrote");
  fs::path file = dir / "manifest.json";
  if (!fs::is_regular_file(file))
    throw Error("no manifest.json in " + folder + ": not a hyflash bundle; write one with " +
                kExport);
  json::Value doc = json::parse(read_text(file), file.string());
  json::Reader m(doc, file.string());

  int64_t version = m.get("format_version").integer(1);
  if (version > kFormatVersion)
    throw Error("bundle " + folder + " has format version " + std::to_string(version) +
                ", newer than this hyflash-run reads (" + std::to_string(kFormatVersion) +
                "): rebuild hyflash-run from the hyflash that exported it");
  std::string backend = m.get("backend").str();
  if (backend != "executorch")
    throw Error("bundle " + folder + " is for " + backend +
                ", not executorch: hyflash-run runs ExecuTorch bundles (" + kExport + ")");
  if (version < kFormatVersion)
    throw Error("bundle " + folder + " has format version " + std::to_string(version) +
                ": re-export it with " + kExport);

  Manifest out;
  out.folder = folder;
  json::Reader target = m.get("target").get("config");
  json::Reader drafter = m.get("drafter").get("config");
  out.vocab_size = target.get("vocab_size").integer(1);
  out.max_seq_len = target.get("max_seq_len").integer(1);
  out.eos_ids = target.get("eos_token_ids").integers(0);
  out.feature_size = drafter.get("feature_size").integer(1);
  out.block_size = drafter.get("block_size").integer(2);
  out.quant_recipe = m.get("quantization").get("recipe").str();
  if (drafter.get("vocab_size").integer(1) != out.vocab_size)
    drafter.get("vocab_size").fail("differs from target.config.vocab_size");
  for (const json::Reader& s : m.get("drafter").get("state").elements())
    out.state.push_back({s.get("input").str(), shape_of(s.get("shape")), s.get("dtype").str()});

  json::Reader models = m.get("models");
  for (const char* role : kRoles) {
    json::Reader c = models.get(role);
    MethodContract mc{role, c.get("method").str(), specs_of(c.get("inputs")),
                      specs_of(c.get("outputs")), 0};
    if (std::string(role) != "forward") mc.rows = c.get("commit_rows").integer(1);
    std::string pte = c.get("file").str();
    if (out.program_file.empty()) out.program_file = pte;
    if (pte != out.program_file) c.get("file").fail("names another program than forward's");
    out.methods.emplace(role, std::move(mc));
  }

  for (const auto& [name, entry] : m.get("files").entries()) {
    int64_t bytes = entry.get("bytes").integer(0);
    fs::path path = dir / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      throw Error("bundle " + folder + " is missing " + name +
                  " (listed in manifest.json): copy the whole bundle folder, or re-export it");
    if (int64_t(fs::file_size(path, ec)) != bytes)
      throw Error("bundle file " + path.string() + " is corrupted: its size differs from "
                  "manifest.json; copy it again, or re-export the bundle");
  }
  if (!m.get("files").has(out.program_file))
    throw Error("bundle " + folder + ": manifest.json does not list " + out.program_file +
                " under files: re-export it with " + kExport);
  return out;
}

}  // namespace hyflash
