// hyflash-run: greedy speculative decoding of an ExecuTorch bundle from token ids, in C++.
//
//   hyflash-run BUNDLE --prompt-ids 1,2,3 [--max-new-tokens N] [--threads N] [--no-draft]
//               [--lookup] [--adaptive] [--draft-rows all|auto|P] [--ignore-eos]
//               [--repeat N] [--json]
//
// Prints the new token ids and the stats (tau, acceptance by position, tokens/s) as a table
// or, with --json, one JSON object. Tokenisation stays in Python (`hyflash generate`);
// this is the phone's loop, runnable on the desktop. A problem the user can fix is one line
// on stderr ("hyflash-run: error: ...") and exit status 2.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../src/engine.h"
#include "../src/error.h"
#include "../src/manifest.h"
#include "../src/program.h"

namespace {

const char* const kUsage =
    "usage: hyflash-run BUNDLE --prompt-ids 1,2,3 [--max-new-tokens N] [--threads N]\n"
    "                   [--no-draft] [--lookup] [--adaptive] [--draft-rows all|auto|P]\n"
    "                   [--ignore-eos] [--repeat N] [--json]\n"
    "\n"
    "Greedy speculative decoding of an ExecuTorch bundle (`hyflash export --backend\n"
    "executorch`) through ExecuTorch's C++ Module API: the phone's loop on the desktop.\n"
    "\n"
    "  BUNDLE              the bundle folder (manifest.json + model.pte)\n"
    "  --prompt-ids IDS    the prompt's token ids, comma-separated\n"
    "  --max-new-tokens N  new tokens at most (default 128)\n"
    "  --threads N         XNNPACK threads (default 1; capped at the machine's cores)\n"
    "  --no-draft          no drafter: plain decoding (with --lookup: copied drafts only)\n"
    "  --lookup            draft by copying from the context where its last 3..1 tokens\n"
    "                      occurred before, the drafter elsewhere (lossless)\n"
    "  --adaptive          each round, take whichever of the lookup (with --lookup), the\n"
    "                      drafter and a plain decode has committed the most tokens per\n"
    "                      second so far (measured; still lossless)\n"
    "  --draft-rows R      which drafted rows a drafter round proposes: all (default), auto\n"
    "                      (as many as maximise expected tokens per second, costs and\n"
    "                      acceptance measured as it runs) or a probability P (the leading\n"
    "                      rows whose best token has at least P); still lossless\n"
    "  --ignore-eos        do not stop at the target's end-of-sequence ids\n"
    "  --repeat N          generate N times (the program loaded once); stats of each run\n"
    "  --json              one JSON object: tokens, stats (first run), runs (every run)\n";

struct Args {
  std::string bundle;
  std::vector<int64_t> prompt;
  bool has_prompt = false;
  int64_t max_new_tokens = 128, threads = 1, repeat = 1;
  bool no_draft = false, lookup = false, adaptive = false, ignore_eos = false, json = false;
  std::string draft_rows = "all";
};

// The --draft-rows policy (null for all), or a one-line Error.
std::unique_ptr<hyflash::RowPolicy> row_policy(const std::string& text) {
  if (text == "all") return nullptr;
  if (text == "auto") return std::make_unique<hyflash::ExpectedRate>();
  size_t used = 0;
  double p = -1;
  try {
    p = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size())
    throw hyflash::Error("--draft-rows " + text + ": pass all, auto or a probability cutoff "
                         "such as 0.2");
  return std::make_unique<hyflash::Cutoff>(p);
}

int64_t positive(const std::string& flag, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || used == 0 || v < 1)
    throw hyflash::Error(flag + " must be a positive integer, got '" + text + "'");
  return v;
}

std::vector<int64_t> token_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
    std::string t = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size())
      throw hyflash::Error("--prompt-ids: '" + t + "' is not a token id: pass comma-separated "
                           "integers, e.g. --prompt-ids 1,2,3");
    ids.push_back(v);
  }
  if (ids.empty()) throw hyflash::Error("--prompt-ids is empty: pass at least one token id");
  return ids;
}

Args parse(int argc, char** argv) {
  Args a;
  auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw hyflash::Error(flag + " needs a value (see hyflash-run --help)");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "--prompt-ids") {
      a.prompt = token_ids(value(i, arg));
      a.has_prompt = true;
    } else if (arg == "--max-new-tokens") {
      a.max_new_tokens = positive(arg, value(i, arg));
    } else if (arg == "--threads") {
      a.threads = positive(arg, value(i, arg));
    } else if (arg == "--repeat") {
      a.repeat = positive(arg, value(i, arg));
    } else if (arg == "--no-draft") {
      a.no_draft = true;
    } else if (arg == "--lookup") {
      a.lookup = true;
    } else if (arg == "--adaptive") {
      a.adaptive = true;
    } else if (arg == "--draft-rows") {
      a.draft_rows = value(i, arg);
      row_policy(a.draft_rows);  // checked here, before the program loads
    } else if (arg == "--ignore-eos") {
      a.ignore_eos = true;
    } else if (arg == "--json") {
      a.json = true;
    } else if (arg.rfind("-", 0) == 0) {
      throw hyflash::Error("unknown option " + arg + " (see hyflash-run --help)");
    } else if (a.bundle.empty()) {
      a.bundle = arg;
    } else {
      throw hyflash::Error("unexpected argument '" + arg + "': pass one BUNDLE folder");
    }
  }
  if (a.bundle.empty()) throw hyflash::Error("no BUNDLE given (see hyflash-run --help)");
  if (!a.has_prompt) throw hyflash::Error("--prompt-ids is required, e.g. --prompt-ids 1,2,3");
  if (a.no_draft && a.draft_rows != "all")
    throw hyflash::Error("--draft-rows " + a.draft_rows + " chooses among the drafter's rows, "
                         "and --no-draft runs no drafter: drop one of them");
  int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  if (a.threads > cores) {
    std::fprintf(stderr, "note: --threads %lld capped at %lld, the cores of this machine\n",
                 (long long)a.threads, (long long)cores);
    a.threads = cores;
  }
  return a;
}

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

int run(const Args& a) {
  hyflash::Program program(hyflash::read_manifest(a.bundle), int(a.threads));
  hyflash::ExecuTorchTarget target(program);
  hyflash::ExecuTorchDrafter drafter(program);
  hyflash::ContextLookup lookup(3, 1, drafter.block_size());
  hyflash::RateGate gate;
  std::unique_ptr<hyflash::RowPolicy> rows = row_policy(a.draft_rows);
  hyflash::Engine engine(target, a.no_draft ? nullptr : &drafter, a.lookup ? &lookup : nullptr,
                         a.adaptive ? &gate : nullptr, rows.get());
  std::vector<int64_t> eos;
  if (!a.ignore_eos) eos = program.manifest().eos_ids;

  std::vector<hyflash::Generation> runs;
  for (int64_t i = 0; i < a.repeat; ++i)
    runs.push_back(engine.generate(a.prompt, a.max_new_tokens, eos));
  for (const auto& g : runs)
    if (g.tokens != runs[0].tokens)
      throw hyflash::Error("repeated runs decoded different tokens: the program is not "
                           "deterministic on this machine; report it with the bundle");

  const hyflash::Generation& first = runs[0];
  if (a.json) {
    std::string all;
    for (const auto& g : runs) all += (all.empty() ? "" : ", ") + hyflash::stats_json(g.stats);
    std::cout << "{\"prompt\": " << ids_json(first.prompt)
              << ", \"tokens\": " << ids_json(first.tokens)
              << ", \"stats\": " << hyflash::stats_json(first.stats) << ", \"runs\": [" << all
              << "]}\n";
  } else {
    std::cout << "tokens: ";
    for (size_t i = 0; i < first.tokens.size(); ++i)
      std::cout << (i ? "," : "") << first.tokens[i];
    std::cout << "\n\n" << hyflash::stats_table(first.stats);
    for (size_t i = 1; i < runs.size(); ++i)
      std::printf("run %zu: %.1f tokens/s\n", i + 1, runs[i].stats.tokens_per_s());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const hyflash::Error& e) {
    std::fprintf(stderr, "hyflash-run: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // a bug, not bad input: still one line
    std::fprintf(stderr, "hyflash-run: internal error: %s\n", e.what());
    return 1;
  }
}
