#include "stats.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

namespace hyflash {
namespace {

std::string num(double x) {
  if (std::isnan(x) || std::isinf(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

template <typename T>
std::string list(const std::vector<T>& xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + num(double(xs[i]));
  return out + "]";
}

std::string fixed(double x, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

double Stats::tau() const {
  return rounds ? double(accepted_drafts + rounds) / double(rounds) : NAN;
}

std::vector<double> Stats::acceptance_rates() const {
  std::vector<double> out;
  for (size_t i = 0; i < position_proposed.size(); ++i)
    out.push_back(position_proposed[i] ? double(position_accepted[i]) / position_proposed[i]
                                       : NAN);
  return out;
}

double Stats::tokens_per_s() const { return total_s > 0 ? new_tokens / total_s : NAN; }

double Stats::overhead_s() const {
  return std::max(0.0, total_s - prefill_s - draft_s - verify_s);
}

std::string stats_json(const Stats& s) {
  std::ostringstream o;
  o << "{\"block_size\": " << s.block_size << ", \"prompt_tokens\": " << s.prompt_tokens
    << ", \"new_tokens\": " << s.new_tokens << ", \"rounds\": " << s.rounds
    << ", \"target_calls\": " << s.target_calls << ", \"drafter_calls\": " << s.drafter_calls
    << ", \"accepted_drafts\": " << s.accepted_drafts
    << ", \"dropped_draft_rows\": " << s.dropped_draft_rows
    << ", \"cut_draft_rows\": " << s.cut_draft_rows
    << ", \"lookup_rounds\": " << s.lookup_rounds << ", \"plain_rounds\": " << s.plain_rounds
    << ", \"position_proposed\": " << list(s.position_proposed)
    << ", \"position_accepted\": " << list(s.position_accepted)
    << ", \"tau\": " << num(s.tau()) << ", \"acceptance_rates\": " << list(s.acceptance_rates())
    << ", \"prefill_s\": " << num(s.prefill_s) << ", \"draft_s\": " << num(s.draft_s)
    << ", \"verify_s\": " << num(s.verify_s) << ", \"overhead_s\": " << num(s.overhead_s())
    << ", \"total_s\": " << num(s.total_s) << ", \"tokens_per_s\": " << num(s.tokens_per_s())
    << ", \"peak_rss_mib\": " << num(s.peak_rss_mib) << ", \"stop_reason\": \""
    << s.stop_reason << "\"}";
  return o.str();
}

std::string stats_table(const Stats& s) {
  auto pct = [&](double x) {
    return s.total_s > 0 ? fixed(1000 * x, 1) + " ms  " + fixed(100 * x / s.total_s, 1) + " %"
                         : std::string("-");
  };
  std::string rates;
  for (double r : s.acceptance_rates())
    rates += (rates.empty() ? "" : " ") + (std::isnan(r) ? std::string("-") : fixed(r, 2));
  bool spec = s.block_size > 1;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"stop reason", s.stop_reason},
      {"prompt / new tokens",
       std::to_string(s.prompt_tokens) + " / " + std::to_string(s.new_tokens)},
      {"block size", spec ? std::to_string(s.block_size) : "- (plain decoding)"},
      {"tau (tokens per verify)", std::isnan(s.tau()) ? "-" : fixed(s.tau(), 2)},
      {"acceptance by position", rates.empty() ? "-" : rates},
      {"target calls", std::to_string(s.target_calls) + " (1 prefill + " +
                           std::to_string(s.rounds) + (spec ? " verify)" : " decode)")},
      {"drafter calls", std::to_string(s.drafter_calls)},
  };
  if (s.lookup_rounds)
    rows.push_back({"rounds drafted by lookup",
                    std::to_string(s.lookup_rounds) + " of " + std::to_string(s.rounds)});
  if (s.plain_rounds)
    rows.push_back({"rounds decoded plain by the gate",
                    std::to_string(s.plain_rounds) + " of " + std::to_string(s.rounds)});
  if (s.cut_draft_rows)
    rows.push_back({"drafted rows not proposed",
                    std::to_string(s.cut_draft_rows) + " (draft rows policy)"});
  std::vector<std::pair<std::string, std::string>> times = {
      {"prefill", pct(s.prefill_s)},
      {"drafting", pct(s.draft_s)},
      {spec ? "verifying" : "decoding", pct(s.verify_s)},
      {"overhead", pct(s.overhead_s())},
      {"total", fixed(1000 * s.total_s, 1) + " ms"},
      {"tokens/s", std::isnan(s.tokens_per_s()) ? "-" : fixed(s.tokens_per_s(), 1)},
      {"peak RSS", fixed(s.peak_rss_mib, 0) + " MiB"},
  };
  rows.insert(rows.end(), times.begin(), times.end());
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [k, v] : rows)
    out += k + std::string(width - k.size() + 2, ' ') + v + "\n";
  return out;
}

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

}  // namespace hyflash
