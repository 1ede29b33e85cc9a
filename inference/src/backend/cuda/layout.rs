//! The host-side index arrays of one step, uploaded before the kernels run: per token its id, position, KV-cache
//! slot and where its sequence's block table starts in the flattened tables, the rows whose logits are wanted,
//! and per logit row the sampling parameters and token history of `sample_rows` ([`super::sample::push_row`]).
//!
//! Owns the paged addressing on the device side: a position `p` of a sequence lives in slot
//! `table[p / block_size] * block_size + p % block_size` (the CPU backend's rule), and the packing of the arrays
//! into the one index buffer a step uploads ([`Packed`]). Also owns the shape of a CUDA-graph step
//! ([`GraphShape`]): a decode batch padded to a captured batch size, each row's block table at a fixed stride,
//! so the arrays sit at the same device addresses at every replay and only their contents change. Pure; the
//! batch must have been validated ([`crate::backend::validate_batch`]) and the cache must have fewer than 2³¹
//! slots (checked when the cache is created).

use super::sample::{self, SAMPLE_WORDS};
use crate::backend::{BatchItem, Logits};

/// Where each array of a step starts in the packed index buffer (element offsets), and how many token rows and
/// logit rows the step computes. The tables and then the sampling histories (whose length varies) come last, so
/// the offsets of a padded graph step depend only on its [`GraphShape`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Packed {
    /// Token rows computed (a graph step: the padded batch size).
    pub n: usize,
    /// Logit rows computed.
    pub nl: usize,
    /// Offset of the token ids.
    pub tokens: usize,
    /// Offset of the positions.
    pub pos: usize,
    /// Offset of the KV-cache slots.
    pub slot: usize,
    /// Offset of the block-table offsets.
    pub table_off: usize,
    /// Offset of the logit rows.
    pub logit_rows: usize,
    /// Offset of the logit rows' sampling parameters (`SAMPLE_WORDS` each).
    pub params: usize,
    /// Offset of the concatenated block tables.
    pub tables: usize,
    /// Offset of the sampling histories (two words per entry), after the tables.
    pub history: usize,
    /// Elements in all.
    pub len: usize,
}

impl Packed {
    /// Entries in the sampling histories.
    pub fn history_entries(&self) -> usize {
        (self.len - self.history) / 2
    }
}

/// The fixed shape of a CUDA-graph decode step: `batch` rows (real ones first, then padding), each row's block
/// table at `row * stride` in the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphShape {
    /// Captured batch size (token rows, one per sequence).
    pub batch: usize,
    /// Block-table entries reserved per row: enough for the longest sequence the cache can hold.
    pub stride: usize,
    /// The spare block padding rows write their K/V into and read it back from (never in a real table).
    pub pad_block: u32,
}

/// The batch sizes graphs are captured for, vLLM's way: 1, 2, 4, 8, then multiples of 8 up to `max_batch`
/// (itself included), so a decode batch is padded by fewer than 8 rows (or to the next power of two below 8).
pub fn capture_sizes(max_batch: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 2, 4]
        .into_iter()
        .chain((8..).step_by(8))
        .take_while(|&b| b < max_batch)
        .collect();
    if max_batch > 0 {
        v.push(max_batch);
    }
    v
}

/// Block-table entries a graph row reserves: one per block of the longest sequence (the model's context, and no
/// more than the pool holds).
pub fn table_stride(context_len: usize, block_size: usize, num_blocks: usize) -> usize {
    context_len
        .div_ceil(block_size.max(1))
        .clamp(1, num_blocks.max(1))
}

/// The captured batch size that runs `batch` as a graph, when it can: a pure decode batch (one token per item,
/// logits wanted for each) of at most the largest captured size, each position within `stride` blocks. `None`:
/// the step runs eagerly.
pub fn graph_batch(
    batch: &[BatchItem<'_>],
    sizes: &[usize],
    block_size: usize,
    stride: usize,
) -> Option<usize> {
    let decode_only = batch
        .iter()
        .all(|it| it.tokens.len() == 1 && it.logits.wanted() && it.start_pos / block_size.max(1) < stride);
    if batch.is_empty() || !decode_only {
        return None;
    }
    sizes.iter().copied().find(|&b| b >= batch.len())
}

/// Index arrays of one step (i32, as the kernels take them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepLayout {
    /// Token ids, `[n]`.
    pub tokens: Vec<i32>,
    /// Position of each token in its sequence, `[n]`.
    pub pos: Vec<i32>,
    /// KV-cache slot of each token, `[n]`.
    pub slot: Vec<i32>,
    /// Offset of each token's block table in `tables`, `[n]`.
    pub table_off: Vec<i32>,
    /// The items' block tables, concatenated.
    pub tables: Vec<i32>,
    /// Token rows whose logits are wanted, in batch order.
    pub logit_rows: Vec<i32>,
    /// Sampling parameters of each logit row, `[nl][SAMPLE_WORDS]`.
    pub params: Vec<i32>,
    /// The sampled rows' token histories, concatenated (two words per entry).
    pub history: Vec<i32>,
}

impl StepLayout {
    /// Refills the arrays for `batch` (reusing their memory).
    pub fn build(&mut self, batch: &[BatchItem<'_>], block_size: usize) {
        self.tokens.clear();
        self.pos.clear();
        self.slot.clear();
        self.table_off.clear();
        self.tables.clear();
        self.logit_rows.clear();
        self.params.clear();
        self.history.clear();
        for it in batch {
            let off = self.tables.len() as i32;
            self.tables.extend(it.block_table.iter().map(|&b| b as i32));
            for (j, &tok) in it.tokens.iter().enumerate() {
                let p = it.start_pos + j;
                self.tokens.push(tok as i32);
                self.pos.push(p as i32);
                self.slot.push(slot(it.block_table, p, block_size) as i32);
                self.table_off.push(off);
            }
            if it.logits.wanted() {
                self.logit_rows.push(self.tokens.len() as i32 - 1);
                sample::push_row(&it.logits, &mut self.params, &mut self.history);
            }
        }
    }

    /// Refills the arrays for a decode batch (see [`graph_batch`]) padded to `shape`: row `i < batch.len()` is
    /// item `i`'s token with its table at `i * stride`; padding rows decode token 0 at position 0 of a table that
    /// names only the pad block, so they touch no real sequence's cache and their outputs are never read. Every
    /// row's logits are computed (rows in order).
    pub fn build_graph(&mut self, batch: &[BatchItem<'_>], block_size: usize, shape: GraphShape) {
        self.tokens.clear();
        self.pos.clear();
        self.slot.clear();
        self.table_off.clear();
        self.logit_rows.clear();
        self.params.clear();
        self.history.clear();
        self.tables.clear();
        self.tables
            .resize(shape.batch * shape.stride, shape.pad_block as i32);
        for row in 0..shape.batch {
            let off = row * shape.stride;
            self.table_off.push(off as i32);
            self.logit_rows.push(row as i32);
            match batch.get(row) {
                Some(it) => {
                    let used = (it.start_pos / block_size + 1)
                        .min(it.block_table.len())
                        .min(shape.stride);
                    for (dst, &b) in self.tables[off..off + used].iter_mut().zip(it.block_table) {
                        *dst = b as i32;
                    }
                    self.tokens.push(it.tokens[0] as i32);
                    self.pos.push(it.start_pos as i32);
                    self.slot
                        .push(slot(it.block_table, it.start_pos, block_size) as i32);
                    sample::push_row(&it.logits, &mut self.params, &mut self.history);
                }
                None => {
                    self.tokens.push(0);
                    self.pos.push(0);
                    self.slot.push((shape.pad_block as usize * block_size) as i32);
                    sample::push_row(&Logits::Argmax, &mut self.params, &mut self.history);
                }
            }
        }
    }

    /// Writes the arrays one after another into `out` (cleared first) and says where each starts.
    pub fn pack(&self, out: &mut Vec<i32>) -> Packed {
        out.clear();
        let mut at = |v: &[i32]| {
            let o = out.len();
            out.extend_from_slice(v);
            o
        };
        let tokens = at(&self.tokens);
        let pos = at(&self.pos);
        let slot = at(&self.slot);
        let table_off = at(&self.table_off);
        let logit_rows = at(&self.logit_rows);
        let params = at(&self.params);
        let tables = at(&self.tables);
        let history = at(&self.history);
        Packed {
            n: self.tokens.len(),
            nl: self.logit_rows.len(),
            tokens,
            pos,
            slot,
            table_off,
            logit_rows,
            params,
            tables,
            history,
            len: out.len(),
        }
    }
}

impl Packed {
    /// The offsets of a graph step of `shape` (what [`StepLayout::build_graph`] + [`StepLayout::pack`] give,
    /// whatever the batch; `len` without histories): the capture uses these before any batch exists.
    pub fn of_graph(shape: GraphShape) -> Packed {
        let b = shape.batch;
        let tables = 5 * b + b * SAMPLE_WORDS;
        let history = tables + b * shape.stride;
        Packed {
            n: b,
            nl: b,
            tokens: 0,
            pos: b,
            slot: 2 * b,
            table_off: 3 * b,
            logit_rows: 4 * b,
            params: 5 * b,
            tables,
            history,
            len: history,
        }
    }

    /// Whether a packed step has a graph's offsets (its histories may follow).
    pub fn same_offsets(&self, graph: &Packed) -> bool {
        Packed {
            len: graph.len,
            ..*self
        } == *graph
    }
}

/// Cache slot of position `pos` of a sequence with block table `table`.
pub fn slot(table: &[u32], pos: usize, block_size: usize) -> usize {
    table[pos / block_size] as usize * block_size + pos % block_size
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{PenaltyEntry, SampleSpec, SamplingParams};

    #[test]
    fn a_mixed_batch_maps_every_token_to_its_slot_and_table() {
        let a_tokens = [5u32, 6, 7];
        let a_table = [9u32, 2];
        let b_tokens = [8u32];
        let b_table = [4u32, 0, 3];
        let batch = [
            // A prefill chunk at positions 3..6 with block size 4: slots 9*4+3, 2*4+0, 2*4+1.
            BatchItem {
                tokens: &a_tokens,
                start_pos: 3,
                block_table: &a_table,
                logits: Logits::None,
            },
            // A decode token at position 9: block 3, offset 1.
            BatchItem {
                tokens: &b_tokens,
                start_pos: 9,
                block_table: &b_table,
                logits: Logits::Full,
            },
        ];
        let mut l = StepLayout::default();
        l.build(&batch, 4);
        assert_eq!(l.tokens, vec![5, 6, 7, 8]);
        assert_eq!(l.pos, vec![3, 4, 5, 9]);
        assert_eq!(l.slot, vec![39, 8, 9, 13]);
        assert_eq!(l.tables, vec![9, 2, 4, 0, 3]);
        assert_eq!(l.table_off, vec![0, 0, 0, 2]);
        assert_eq!(l.logit_rows, vec![3]);
        // Rebuilding reuses the arrays and forgets the old step.
        l.build(&batch[1..], 4);
        assert_eq!((l.tokens.len(), l.table_off.clone()), (1, vec![0]));
        assert_eq!(l.logit_rows, vec![0]);
    }

    #[test]
    fn capture_sizes_follow_vllm_and_end_at_the_largest_batch() {
        assert_eq!(capture_sizes(1), vec![1]);
        assert_eq!(capture_sizes(3), vec![1, 2, 3]);
        assert_eq!(capture_sizes(8), vec![1, 2, 4, 8]);
        assert_eq!(capture_sizes(32), vec![1, 2, 4, 8, 16, 24, 32]);
        assert_eq!(capture_sizes(20), vec![1, 2, 4, 8, 16, 20]);
        assert!(capture_sizes(0).is_empty());
        assert_eq!(table_stride(8192, 16, 1024), 512);
        assert_eq!(
            table_stride(8192, 16, 100),
            100,
            "no more entries than the pool has blocks"
        );
        assert_eq!(table_stride(30, 16, 100), 2);
    }

    #[test]
    fn only_pure_decode_batches_within_the_stride_run_as_graphs() {
        let (t1, t2) = ([5u32], [6u32, 7]);
        let table = [1u32, 2, 3];
        let dec = |pos| BatchItem {
            tokens: &t1,
            start_pos: pos,
            block_table: &table,
            logits: Logits::Full,
        };
        let sizes = capture_sizes(32);
        assert_eq!(graph_batch(&[dec(3)], &sizes, 4, 3), Some(1));
        assert_eq!(graph_batch(&[dec(3); 3], &sizes, 4, 3), Some(4));
        assert_eq!(graph_batch(&[dec(3); 17], &sizes, 4, 3), Some(24));
        assert_eq!(
            graph_batch(&[dec(3); 33], &sizes, 4, 3),
            None,
            "beyond the largest size"
        );
        assert_eq!(
            graph_batch(&[dec(12)], &sizes, 4, 3),
            None,
            "position past the stride"
        );
        assert_eq!(graph_batch(&[], &sizes, 4, 3), None);
        let chunk = BatchItem {
            tokens: &t2,
            start_pos: 0,
            block_table: &table,
            logits: Logits::Full,
        };
        assert_eq!(
            graph_batch(&[dec(3), chunk], &sizes, 4, 3),
            None,
            "a prefill chunk"
        );
        let no_logits = BatchItem {
            logits: Logits::None,
            ..dec(3)
        };
        assert_eq!(graph_batch(&[no_logits], &sizes, 4, 3), None);
    }

    #[test]
    fn a_padded_graph_step_keeps_real_rows_and_parks_padding_in_the_pad_block() {
        let (a, b) = ([11u32], [12u32]);
        let (ta, tb) = ([9u32, 2, 14], [3u32, 0]);
        let batch = [
            BatchItem {
                tokens: &a,
                start_pos: 5,
                block_table: &ta,
                logits: Logits::Full,
            },
            BatchItem {
                tokens: &b,
                start_pos: 7,
                block_table: &tb,
                logits: Logits::Full,
            },
        ];
        let shape = GraphShape {
            batch: 4,
            stride: 3,
            pad_block: 20,
        };
        let mut l = StepLayout::default();
        l.build_graph(&batch, 4, shape);
        assert_eq!(l.tokens, vec![11, 12, 0, 0]);
        assert_eq!(l.pos, vec![5, 7, 0, 0]);
        // A at 5: block 1 of its table (2), offset 1; B at 7: block 1 (0), offset 3; padding: the pad block.
        assert_eq!(l.slot, vec![9, 3, 80, 80]);
        assert_eq!(l.table_off, vec![0, 3, 6, 9]);
        // Only the blocks up to each row's position are copied; the rest name the pad block.
        assert_eq!(l.tables, vec![9, 2, 20, 3, 0, 20, 20, 20, 20, 20, 20, 20]);
        assert_eq!(l.logit_rows, vec![0, 1, 2, 3]);
        // The packed offsets are the shape's, whatever the batch.
        let mut buf = Vec::new();
        let p = l.pack(&mut buf);
        assert_eq!(p, Packed::of_graph(shape));
        assert_eq!(p.history_entries(), 0);
        assert_eq!(&buf[p.slot..p.slot + 4], &[9, 3, 80, 80]);
        assert_eq!(buf.len(), p.len);
        l.build_graph(&batch[..1], 4, shape);
        assert_eq!(l.pack(&mut buf), Packed::of_graph(shape));
        assert_eq!(&buf[p.tokens..p.tokens + 4], &[11, 0, 0, 0]);
    }

    #[test]
    fn sampled_rows_carry_parameters_and_histories_after_the_tables() {
        let (a, b) = ([11u32], [12u32]);
        let table = [1u32, 2];
        let hist = [PenaltyEntry { token: 4, word: 3 }];
        let spec = SampleSpec {
            params: SamplingParams {
                frequency_penalty: 0.5,
                ..SamplingParams::default()
            },
            seed: 7,
            index: 0,
            history: &hist,
            logprobs: None,
        };
        let batch = [
            BatchItem {
                tokens: &a,
                start_pos: 1,
                block_table: &table,
                logits: Logits::Argmax,
            },
            BatchItem {
                tokens: &b,
                start_pos: 2,
                block_table: &table,
                logits: Logits::Sample(spec),
            },
        ];
        let shape = GraphShape {
            batch: 4,
            stride: 2,
            pad_block: 9,
        };
        let mut l = StepLayout::default();
        l.build_graph(&batch, 4, shape);
        let mut buf = Vec::new();
        let p = l.pack(&mut buf);
        let g = Packed::of_graph(shape);
        assert!(
            p.same_offsets(&g) && p != g,
            "the history follows the graph's fixed arrays"
        );
        assert_eq!(p.history_entries(), 1);
        assert_eq!(&buf[p.history..], &[4, 3]);
        assert_eq!(buf[p.params], 0, "row 0 takes the argmax");
        assert_eq!(buf[p.params + SAMPLE_WORDS], 1, "row 1 samples");
        assert_eq!(buf[p.params + 2 * SAMPLE_WORDS], 0, "padding takes the argmax");
        assert_eq!(l.params.len(), 4 * SAMPLE_WORDS);
    }

    #[test]
    fn an_eager_step_packs_its_arrays_back_to_back() {
        let toks = [1u32, 2, 3];
        let table = [4u32];
        let batch = [BatchItem {
            tokens: &toks,
            start_pos: 0,
            block_table: &table,
            logits: Logits::Full,
        }];
        let mut l = StepLayout::default();
        l.build(&batch, 4);
        let mut buf = vec![99];
        let p = l.pack(&mut buf);
        assert_eq!((p.n, p.nl, p.len), (3, 1, 3 * 4 + 1 + SAMPLE_WORDS + 1));
        assert_eq!(&buf[p.tokens..p.tokens + 3], &[1, 2, 3]);
        assert_eq!(&buf[p.slot..p.slot + 3], &[16, 17, 18]);
        assert_eq!(buf[p.logit_rows], 2);
        assert_eq!(buf[p.tables], 4);
    }
}
