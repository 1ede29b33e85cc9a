//! Continuous-batching scheduler, after vLLM V1's `Scheduler.schedule()` (vllm/v1/core/sched/scheduler.py).
//!
//! Owns which sequences run in each step and how many of their tokens. There is no separate prefill and decode
//! phase: each sequence has `num_computed` tokens in the KV cache and `tokens.len()` known tokens (prompt + output),
//! and a step computes up to the difference, within a per-step token budget (`max_num_batched_tokens`), which gives
//! chunked prefill for free. Per step:
//! 1. Running sequences first, in arrival order (so decodes of running sequences are never starved by new
//!    prompts). Each gets its KV slots from the [`KvCacheManager`]; when the pool is exhausted the *newest* running
//!    sequence is preempted by recompute (its blocks freed, `num_computed` reset to 0, put at the front of the
//!    waiting queue), repeatedly, until the allocation fits or the sequence itself was the one preempted.
//! 2. Then, only if nobody was preempted in this step, waiting sequences in FIFO order while the token budget,
//!    the cap on running sequences (`max_num_seqs`) and the free blocks allow (admission by free blocks).
//!
//! The scheduler never runs compute, never blocks and never owns the client side of a request (the engine does).

use std::collections::VecDeque;

use crate::kv_cache_manager::KvCacheManager;

/// Scheduling limits.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Cap on running sequences (vLLM `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Per-step token budget (vLLM `max_num_batched_tokens`).
    pub max_num_batched_tokens: usize,
}

/// A sequence as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct Sequence {
    /// Engine request id.
    pub id: u64,
    /// Prompt tokens followed by the output tokens sampled so far.
    pub tokens: Vec<u32>,
    /// Length of the original prompt.
    pub num_prompt: usize,
    /// Tokens whose K/V are in the cache.
    pub num_computed: usize,
    /// Times preempted.
    pub num_preemptions: u32,
    /// Whether it was ever scheduled.
    pub ever_scheduled: bool,
}

impl Sequence {
    /// A new sequence for a prompt.
    pub fn new(id: u64, prompt: Vec<u32>) -> Self {
        let num_prompt = prompt.len();
        Self {
            id,
            tokens: prompt,
            num_prompt,
            num_computed: 0,
            num_preemptions: 0,
            ever_scheduled: false,
        }
    }

    /// Output tokens so far.
    pub fn num_output(&self) -> usize {
        self.tokens.len() - self.num_prompt
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Engine request id.
    pub id: u64,
    /// Position of the first token computed in this step.
    pub start_pos: usize,
    /// Tokens computed in this step.
    pub num_tokens: usize,
    /// True when this computes the last known token, so its logits give the next token.
    pub need_logits: bool,
    /// True for the one-token decode of a sequence with output (false for prompt and recompute chunks).
    pub is_decode: bool,
}

/// What one call to [`Scheduler::schedule`] decided.
#[derive(Debug, Default, Clone)]
pub struct SchedulerOutput {
    /// The batch, in order.
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences preempted in this step.
    pub preempted: Vec<u64>,
    /// Sequences scheduled for the first time in their life.
    pub first_scheduled: Vec<u64>,
    /// Prompt (and recompute) tokens in the batch.
    pub prefill_tokens: usize,
    /// Decode tokens in the batch.
    pub decode_tokens: usize,
}

/// The continuous-batching scheduler.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    num_preemptions_total: u64,
}

impl Scheduler {
    /// A scheduler over a KV cache of `num_blocks` blocks of `block_size` slots.
    pub fn new(cfg: SchedulerConfig, num_blocks: usize, block_size: usize) -> Self {
        let cfg = SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs.max(1),
            max_num_batched_tokens: cfg.max_num_batched_tokens.max(1),
        };
        Self {
            cfg,
            kv: KvCacheManager::new(num_blocks, block_size),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions_total: 0,
        }
    }

    /// The KV-cache manager (block tables, usage).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Most tokens one sequence can ever hold (the whole pool).
    pub fn max_tokens_per_seq(&self) -> usize {
        self.kv.num_blocks() * self.kv.block_size()
    }

    /// Queues a new sequence.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Sequences waiting (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Preemptions since start.
    pub fn num_preemptions_total(&self) -> u64 {
        self.num_preemptions_total
    }

    /// Whether there is nothing to do.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// A running or waiting sequence.
    pub fn get(&self, id: u64) -> Option<&Sequence> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)
    }

    /// Ids of all running and waiting sequences.
    pub fn ids(&self) -> Vec<u64> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.id)
            .collect()
    }

    /// Decides the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;

        // 1. Running sequences (decodes and unfinished prefills), oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (id, computed, known) = {
                let s = &self.running[i];
                (s.id, s.num_computed, s.tokens.len())
            };
            let n = known.saturating_sub(computed).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let mut self_preempted = false;
            while !self.kv.allocate_slots(id, computed + n) {
                // Preempt the newest running sequence (possibly this one).
                let Some(mut victim) = self.running.pop() else {
                    break;
                };
                self.kv.free(victim.id);
                victim.num_computed = 0;
                victim.num_preemptions += 1;
                self.num_preemptions_total += 1;
                out.preempted.push(victim.id);
                let is_self = victim.id == id;
                self.waiting.push_front(victim);
                if is_self {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            let s = &self.running[i];
            let is_decode = n == 1 && s.num_output() > 0 && computed + 1 == known;
            out.seqs.push(ScheduledSeq {
                id,
                start_pos: computed,
                num_tokens: n,
                need_logits: computed + n == known,
                is_decode,
            });
            if is_decode {
                out.decode_tokens += 1;
            } else {
                out.prefill_tokens += n;
            }
            budget -= n;
            i += 1;
        }

        // 2. Waiting sequences, FIFO, only when nothing was preempted.
        if out.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(s) = self.waiting.front() else { break };
                let (id, computed, known) = (s.id, s.num_computed, s.tokens.len());
                let n = known.saturating_sub(computed).min(budget);
                if n == 0 || !self.kv.allocate_slots(id, computed + n) {
                    break;
                }
                let Some(mut s) = self.waiting.pop_front() else {
                    break;
                };
                if !s.ever_scheduled {
                    s.ever_scheduled = true;
                    out.first_scheduled.push(id);
                }
                out.seqs.push(ScheduledSeq {
                    id,
                    start_pos: computed,
                    num_tokens: n,
                    need_logits: computed + n == known,
                    is_decode: false,
                });
                out.prefill_tokens += n;
                budget -= n;
                self.running.push(s);
            }
        }
        out
    }

    /// Records that the scheduled tokens of `out` are now in the KV cache.
    pub fn mark_computed(&mut self, out: &SchedulerOutput) {
        for sc in &out.seqs {
            if let Some(s) = self.running.iter_mut().find(|s| s.id == sc.id) {
                s.num_computed = (sc.start_pos + sc.num_tokens).min(s.tokens.len());
            }
        }
    }

    /// Appends a sampled token to a running sequence.
    pub fn append_token(&mut self, id: u64, token: u32) {
        if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
            s.tokens.push(token);
        }
    }

    /// Removes a sequence (finished or aborted) wherever it is and frees its blocks. Returns it if found.
    pub fn remove(&mut self, id: u64) -> Option<Sequence> {
        self.kv.free(id);
        if let Some(p) = self.running.iter().position(|s| s.id == id) {
            return Some(self.running.remove(p));
        }
        if let Some(p) = self.waiting.iter().position(|s| s.id == id) {
            return self.waiting.remove(p);
        }
        None
    }

    /// After a weight swap: the KV contents are stale, so every running sequence recomputes from position 0
    /// (blocks stay allocated; they are overwritten).
    pub fn invalidate_kv(&mut self) {
        for s in &mut self.running {
            s.num_computed = 0;
        }
        for s in &mut self.waiting {
            s.num_computed = 0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    fn sched(max_seqs: usize, budget: usize, blocks: usize, bs: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: max_seqs,
                max_num_batched_tokens: budget,
            },
            blocks,
            bs,
        )
    }

    /// A fake backend: marks tokens computed and "samples" token 7 where logits were requested.
    fn step(s: &mut Scheduler) -> SchedulerOutput {
        let out = s.schedule();
        s.mark_computed(&out);
        for sc in &out.seqs {
            if sc.need_logits {
                s.append_token(sc.id, 7);
            }
        }
        out
    }

    #[test]
    fn chunked_prefill_within_token_budget_then_decode() {
        let mut s = sched(4, 8, 16, 4);
        s.add(Sequence::new(1, vec![1; 20]));
        let o = step(&mut s);
        assert_eq!(
            o.seqs,
            vec![ScheduledSeq {
                id: 1,
                start_pos: 0,
                num_tokens: 8,
                need_logits: false,
                is_decode: false
            }]
        );
        assert_eq!(o.first_scheduled, vec![1]);
        step(&mut s);
        let o = step(&mut s);
        assert_eq!(
            (o.seqs[0].start_pos, o.seqs[0].num_tokens, o.seqs[0].need_logits),
            (16, 4, true)
        );
        let o = step(&mut s);
        assert!(o.seqs[0].is_decode);
        assert_eq!((o.decode_tokens, o.prefill_tokens), (1, 0));
        assert_eq!(s.get(1).unwrap().num_output(), 2);
    }

    #[test]
    fn decodes_go_first_and_prefill_fills_the_rest_of_the_budget() {
        let mut s = sched(4, 6, 32, 4);
        s.add(Sequence::new(1, vec![1; 3]));
        step(&mut s); // 1 prefilled, has one output token
        s.add(Sequence::new(2, vec![2; 10]));
        let o = step(&mut s);
        assert_eq!(o.seqs[0].id, 1);
        assert!(o.seqs[0].is_decode);
        assert_eq!(
            (o.seqs[1].id, o.seqs[1].num_tokens),
            (2, 5),
            "chunk limited by remaining budget"
        );
        assert_eq!((o.decode_tokens, o.prefill_tokens), (1, 5));
    }

    #[test]
    fn caps_running_sequences() {
        let mut s = sched(2, 100, 32, 4);
        for id in 1..=3 {
            s.add(Sequence::new(id, vec![1; 2]));
        }
        let o = step(&mut s);
        assert_eq!(o.seqs.len(), 2);
        assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
    }

    #[test]
    fn admission_by_free_blocks() {
        let mut s = sched(8, 100, 4, 4);
        s.add(Sequence::new(1, vec![1; 12])); // 3 blocks
        s.add(Sequence::new(2, vec![1; 8])); // 2 blocks: does not fit
        let o = step(&mut s);
        assert_eq!(o.seqs.len(), 1);
        assert_eq!(s.num_waiting(), 1);
        assert_eq!(s.kv().num_used_blocks(), 3);
    }

    #[test]
    fn preempts_newest_by_recompute_and_everything_completes() {
        // 4 blocks of 2 slots; two sequences of 3 prompt tokens each need 2 blocks now and 3 later.
        let mut s = sched(8, 100, 4, 2);
        s.add(Sequence::new(1, vec![1; 3]));
        s.add(Sequence::new(2, vec![2; 3]));
        step(&mut s);
        assert_eq!(s.num_running(), 2);
        // Both now hold 4 tokens (3 + 1 output): the next decode of seq 1 needs a 3rd block.
        let mut preempted = Vec::new();
        let mut done = Vec::new();
        for _ in 0..50 {
            let o = step(&mut s);
            preempted.extend(o.preempted.iter().copied());
            for id in [1, 2] {
                if s.get(id).is_some_and(|q| q.num_output() >= 3) {
                    s.remove(id);
                    done.push(id);
                }
            }
            if s.is_idle() {
                break;
            }
        }
        assert_eq!(
            preempted.first(),
            Some(&2),
            "the newest running sequence is preempted first"
        );
        assert_eq!(done, vec![1, 2]);
        assert_eq!(s.kv().num_used_blocks(), 0);
        assert!(s.num_preemptions_total() > 0);
    }

    #[test]
    fn preempted_sequence_recomputes_its_output_tokens() {
        // 3 blocks of 2 slots. Seq 1 (3 prompt tokens) takes 2 blocks, seq 2 (1 prompt token) takes 1.
        let mut s = sched(8, 100, 3, 2);
        s.add(Sequence::new(1, vec![1; 3]));
        s.add(Sequence::new(2, vec![2; 1]));
        let o = step(&mut s);
        assert_eq!(o.seqs.len(), 2);
        let o = step(&mut s); // both decode within their blocks
        assert!(o.seqs.iter().all(|q| q.is_decode));
        assert!(o.preempted.is_empty());
        // Seq 1 now needs a 3rd block: the newest running sequence (2) is preempted to make room.
        let o = step(&mut s);
        assert_eq!(o.preempted, vec![2]);
        assert_eq!(o.seqs.len(), 1);
        assert_eq!(o.seqs[0].id, 1);
        let q = s.get(2).unwrap();
        assert_eq!(q.num_computed, 0);
        assert_eq!(q.num_output(), 2, "output tokens are kept and will be recomputed");
        assert_eq!(s.num_waiting(), 1);
        // Once seq 1 is gone, seq 2 recomputes prompt + output in one chunk and samples its next token.
        s.remove(1);
        let o = step(&mut s);
        assert_eq!(
            o.seqs[0],
            ScheduledSeq {
                id: 2,
                start_pos: 0,
                num_tokens: 3,
                need_logits: true,
                is_decode: false
            }
        );
        assert_eq!(s.get(2).unwrap().num_output(), 3);
    }

    #[test]
    fn remove_frees_blocks_of_waiting_and_running() {
        let mut s = sched(1, 100, 8, 4);
        s.add(Sequence::new(1, vec![1; 5]));
        s.add(Sequence::new(2, vec![1; 5]));
        step(&mut s);
        assert!(s.remove(2).is_some());
        assert!(s.remove(1).is_some());
        assert!(s.remove(1).is_none());
        assert_eq!(s.kv().num_used_blocks(), 0);
        assert!(s.is_idle());
    }
}
