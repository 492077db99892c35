// The greedy loop, line for line the semantics of SpeculativeEngine._run (engine.py), so
// tokens, tau and per-position acceptance equal the Python engine's on the same program.
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "error.h"

namespace hyflash {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int64_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best] || (std::isnan(row[i]) && !std::isnan(row[best]))) best = i;
  return best;  // torch.argmax: the first maximum, NaN counting as the maximum
}

int64_t distribution_rows(const float* x, int64_t rows, int64_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    bool some = false;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(row[i]) || row[i] == inf) return r;
      some = some || row[i] > -inf;
    }
    if (!some) return r;
  }
  return rows;
}

Engine::Engine(TargetBackend& target, DrafterBackend* drafter, ContextLookup* lookup,
               RateGate* gate, RowPolicy* rows)
    : target_(target), drafter_(drafter), lookup_(lookup), gate_(gate), rows_(rows) {
  if (!drafter) return;
  if (lookup && lookup->block_size() != drafter->block_size())
    throw Error("lookup block size " + std::to_string(lookup->block_size()) +
                " != drafter block size " + std::to_string(drafter->block_size()) +
                ": one verify pass serves both");
  if (drafter->vocab_size() != target.vocab_size())
    throw Error("drafter vocabulary " + std::to_string(drafter->vocab_size()) +
                " != target vocabulary " + std::to_string(target.vocab_size()) +
                ": the drafter was trained for another target");
  if (drafter->feature_size() != target.feature_size())
    throw Error("drafter feature size " + std::to_string(drafter->feature_size()) +
                " != target feature size " + std::to_string(target.feature_size()) +
                ": the drafter was trained for another target (or other tap layers)");
  if (drafter->block_size() < 2)
    throw Error("drafter block size " + std::to_string(drafter->block_size()) +
                " < 2: a block is the anchor plus at least one drafted token");
}

void Engine::check_prompt(const std::vector<int64_t>& ids, int64_t max_new_tokens) const {
  const int64_t limit = target_.max_seq_len(), vocab = target_.vocab_size();
  if (max_new_tokens < 1)
    throw Error("max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  if (ids.empty()) throw Error("empty prompt: pass at least one token");
  for (int64_t t : ids)
    if (t < 0 || t >= vocab)
      throw Error("prompt token id " + std::to_string(t) +
                  " is outside the target's vocabulary 0.." + std::to_string(vocab - 1));
  const int64_t n = int64_t(ids.size());
  if (n >= limit)
    throw Error("prompt of " + std::to_string(n) + " tokens leaves no room in the target's "
                "context of " + std::to_string(limit) + " tokens: shorten it below " +
                std::to_string(limit));
  if (block_size() > limit - n)
    throw Error("block size " + std::to_string(block_size()) + " exceeds the remaining "
                "context: the " + std::to_string(n) + "-token prompt leaves " +
                std::to_string(limit - n) + " of " + std::to_string(limit) +
                " positions; shorten the prompt or use --no-draft");
}

Generation Engine::generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                            const std::vector<int64_t>& eos_ids,
                            const std::function<void(int64_t)>& on_token) {
  check_prompt(prompt, max_new_tokens);
  const int64_t B = block_size(), V = target_.vocab_size();
  Generation g;
  g.prompt = prompt;
  Stats& s = g.stats;
  s.block_size = B;
  s.prompt_tokens = int64_t(prompt.size());
  s.position_proposed.assign(size_t(B - 1), 0);
  s.position_accepted.assign(size_t(B - 1), 0);
  const auto start = Clock::now();
  double paused = 0;

  std::vector<int64_t> tokens = prompt;
  std::string reason;
  // Commit tokens of block in order until a stop rule fires after one; -> how many.
  auto emit = [&](const std::vector<int64_t>& block) -> int64_t {
    int64_t n = 0;
    for (int64_t tok : block) {
      tokens.push_back(tok);
      g.tokens.push_back(tok);
      ++n;
      if (on_token) {
        auto t = Clock::now();
        on_token(tok);
        paused += since(t);
      }
      if (std::find(eos_ids.begin(), eos_ids.end(), tok) != eos_ids.end()) reason = "eos";
      else if (int64_t(g.tokens.size()) >= max_new_tokens) reason = "max_new_tokens";
      else if (int64_t(tokens.size()) >= target_.max_seq_len()) reason = "context_full";
      if (!reason.empty()) break;
    }
    return n;
  };

  // prefill: the prompt in one pass; its features go to the drafter
  target_.reset();
  auto t = Clock::now();
  target_.forward(prompt, 0, logits_, features_);
  s.prefill_s += since(t);
  s.target_calls += 1;
  if (drafter_) {
    t = Clock::now();
    drafter_->reset();
    drafter_->commit(features_.data(), int64_t(prompt.size()));
    s.draft_s += since(t);
  }
  emit({argmax(logits_.data() + (int64_t(prompt.size()) - 1) * V, V)});
  if (lookup_) lookup_->reset(tokens);
  if (gate_) gate_->reset();

  std::vector<int64_t> block;
  while (reason.empty()) {
    const int64_t pos = int64_t(tokens.size()) - 1, anchor = tokens.back();
    int64_t r = std::min(B - 1, target_.max_seq_len() - int64_t(tokens.size()) - 1);

    // draft: copied from the context if the lookup finds a match, else the drafter's (or
    // whichever of them and a plain decode the gate finds pays most)
    const std::vector<int64_t> copied =
        lookup_ && r > 0 ? lookup_->propose(r) : std::vector<int64_t>();
    std::vector<Proposer> available;
    if (!copied.empty()) available.push_back(Proposer::lookup);
    if (r > 0 && drafter_) available.push_back(Proposer::drafter);
    available.push_back(Proposer::plain);
    const Proposer choice = gate_ ? gate_->choose(available) : available[0];
    const auto round_start = Clock::now();
    block.assign(1, anchor);
    if (choice == Proposer::plain) {
      r = 0;
      if (gate_) s.plain_rounds += 1;
    } else if (choice == Proposer::lookup) {
      s.lookup_rounds += 1;
      block.insert(block.end(), copied.begin(), copied.end());
    } else {
      t = Clock::now();
      const std::vector<float>& q = drafter_->draft(anchor, pos);
      if (int64_t(q.size()) != (B - 1) * V)
        throw Error("drafter returned " + std::to_string(q.size()) + " logits, expected " +
                    std::to_string((B - 1) * V) + " (block size - 1, vocabulary)");
      const int64_t rows = distribution_rows(q.data(), r, V);
      s.draft_s += since(t);
      s.drafter_calls += 1;
      int64_t kept = rows;
      if (rows_) {  // broken rows stay "dropped"; rows the policy leaves out are "cut"
        kept = rows_->choose(confidences(q.data(), rows, V));
        if (kept < rows) {
          s.cut_draft_rows += r - kept;
          r = kept;
        }
      }
      for (int64_t i = 0; i < kept; ++i) block.push_back(argmax(q.data() + i * V, V));
      s.dropped_draft_rows += r - kept;
    }

    // verify: one target pass over [anchor, d_1..d_r] at pos
    t = Clock::now();
    target_.forward(block, pos, logits_, features_);
    const double verify_s = since(t);
    s.verify_s += verify_s;
    if (rows_) rows_->record_verify(int64_t(block.size()), verify_s);
    s.target_calls += 1;
    s.rounds += 1;
    const double round_s = since(round_start);

    // accept: the longest prefix equal to the target's argmax, then its bonus token
    const int64_t drafted = int64_t(block.size()) - 1;
    int64_t k = 0;
    while (k < drafted && block[size_t(k + 1)] == argmax(logits_.data() + k * V, V)) ++k;
    const int64_t bonus = argmax(logits_.data() + k * V, V);
    s.accepted_drafts += k;
    if (rows_ && choice == Proposer::drafter) rows_->record_accepted(k);
    for (int64_t i = 0; i < r; ++i) {
      s.position_proposed[size_t(i)] += 1;
      s.position_accepted[size_t(i)] += i < k;
    }
    std::vector<int64_t> keep(block.begin() + 1, block.begin() + 1 + k);
    keep.push_back(bonus);
    const int64_t n = emit(keep);
    if (gate_) gate_->record(choice, k + 1, round_s);
    if (lookup_) lookup_->extend(std::vector<int64_t>(tokens.end() - n, tokens.end()));

    // commit the verified features (anchor + accepted drafts that were emitted)
    if (drafter_) {
      t = Clock::now();
      drafter_->commit(features_.data(), n);
      s.draft_s += since(t);
    }
    // roll back: everything after the last committed-and-processed token is dead
    target_.rollback(pos + n);
    if (rows_ && choice == Proposer::drafter) rows_->record_overhead(since(round_start) - verify_s);
  }

  s.new_tokens = int64_t(g.tokens.size());
  s.stop_reason = reason;
  s.total_s = since(start) - paused;
  s.peak_rss_mib = peak_rss_mib();
  return g;
}

}  // namespace hyflash
