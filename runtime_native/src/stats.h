// What every run reports, with the meaning of hyflash/runtime/stats.py GenerationStats:
// tau = tokens committed per verify call (accepted drafts + the bonus), per-position
// acceptance, call counts, wall time per phase, tokens/s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyflash {

struct Stats {
  int64_t block_size = 1;
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  int64_t rounds = 0;        // verify calls
  int64_t target_calls = 0;  // prefill + verify calls
  int64_t drafter_calls = 0;
  int64_t accepted_drafts = 0;
  int64_t dropped_draft_rows = 0;  // draft rows that were no distribution
  int64_t cut_draft_rows = 0;      // drafted rows a rows policy left unproposed
  int64_t lookup_rounds = 0;       // rounds whose drafts were copied from the context
  int64_t plain_rounds = 0;        // rounds a rate gate decoded without drafts
  std::vector<int64_t> position_proposed, position_accepted;
  double prefill_s = 0, draft_s = 0, verify_s = 0, total_s = 0;
  double peak_rss_mib = 0;
  std::string stop_reason;

  double tau() const;  // NaN without a verify call
  std::vector<double> acceptance_rates() const;
  double tokens_per_s() const;  // new tokens over the whole call, prefill included
  double overhead_s() const;
};

// {"block_size": ..., "tau": ..., "acceptance_rates": [...], ...}; NaN as null.
std::string stats_json(const Stats& s);
// The two-column table `hyflash generate` prints (stats.py format_stats).
std::string stats_table(const Stats& s);
// Peak resident set size of this process (VmHWM), MiB; 0 where unknown.
double peak_rss_mib();

}  // namespace hyflash
