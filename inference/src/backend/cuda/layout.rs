//! The host-side index arrays of one step, uploaded before the kernels run: per token its id, position, KV-cache
//! slot and where its sequence's block table starts in the flattened tables, and the rows whose logits are
//! wanted.
//!
//! Owns the paged addressing on the device side: a position `p` of a sequence lives in slot
//! `table[p / block_size] * block_size + p % block_size` (the CPU backend's rule). Pure; the batch must have
//! been validated ([`crate::backend::validate_batch`]) and the cache must have fewer than 2³¹ slots (checked when
//! the cache is created).

use crate::backend::BatchItem;

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
            if it.need_logits {
                self.logit_rows.push(self.tokens.len() as i32 - 1);
            }
        }
    }

    /// Tokens in the step.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// Cache slot of position `pos` of a sequence with block table `table`.
pub fn slot(table: &[u32], pos: usize, block_size: usize) -> usize {
    table[pos / block_size] as usize * block_size + pos % block_size
}

#[cfg(test)]
mod tests {
    use super::*;

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
                need_logits: false,
            },
            // A decode token at position 9: block 3, offset 1.
            BatchItem {
                tokens: &b_tokens,
                start_pos: 9,
                block_table: &b_table,
                need_logits: true,
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
        assert_eq!((l.num_tokens(), l.table_off.clone()), (1, vec![0]));
        assert_eq!(l.logit_rows, vec![0]);
    }
}
