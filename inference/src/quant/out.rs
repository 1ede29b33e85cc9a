//! Where a matrix product writes its sums ([`MatOut`]), a token-major output matrix that tasks on several
//! threads fill column range by column range ([`SharedCols`]), and f32 buffers that start on a cache line
//! ([`AlignedVec`]).
//!
//! The CPU backend keeps activations token-major (`[token][feature]`), so each task of a split matrix product
//! writes its rows of the product as *columns* of the step's output: the writes of different tasks interleave in
//! memory, which `&mut [f32]` sub-slices cannot express. [`SharedCols`] hands each task a view of its own columns;
//! every store is bounds-checked against the view (one check per output element, against hundreds of
//! multiply-adds), and the one promise the caller makes — no two live views share a column — is what
//! [`SharedCols::columns`] is `unsafe` for.

use std::marker::PhantomData;

/// The output of one matrix-product call: element (row `i` of the call, token `t`), `i < rows`, `t < n_tok`, at
/// `i · row_stride + t · tok_stride` of the underlying buffer; stored, or added to what is there (`accumulate`:
/// a residual connection fused into the product).
#[derive(Debug)]
pub struct MatOut<'a> {
    ptr: *mut f32,
    rows: usize,
    n_tok: usize,
    row_stride: usize,
    tok_stride: usize,
    accumulate: bool,
    _borrow: PhantomData<&'a mut [f32]>,
}

impl<'a> MatOut<'a> {
    /// `[row][token]` into `out`: `out.len() / n_tok` rows.
    ///
    /// # Panics
    /// If `n_tok` is 0 or does not divide `out.len()`.
    pub fn row_major(out: &'a mut [f32], n_tok: usize) -> Self {
        assert!(
            n_tok > 0 && out.len().is_multiple_of(n_tok),
            "output is not whole rows of {n_tok} tokens"
        );
        MatOut {
            ptr: out.as_mut_ptr(),
            rows: out.len() / n_tok,
            n_tok,
            row_stride: n_tok,
            tok_stride: 1,
            accumulate: false,
            _borrow: PhantomData,
        }
    }

    /// Rows of the call.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Tokens of the call.
    pub fn n_tok(&self) -> usize {
        self.n_tok
    }

    /// Writes (or adds) `v` as element (`i`, `t`).
    ///
    /// # Panics
    /// If `i >= rows` or `t >= n_tok`.
    #[inline]
    pub fn put(&mut self, i: usize, t: usize, v: f32) {
        assert!(
            i < self.rows && t < self.n_tok,
            "output element ({i}, {t}) outside {}x{}",
            self.rows,
            self.n_tok
        );
        // SAFETY: every constructor checked that each element (i < rows, t < n_tok) lies inside the buffer it
        // borrows, and that no other live view writes it (`row_major`: an exclusive borrow; `SharedCols::columns`:
        // the caller's promise).
        unsafe {
            let p = self.ptr.add(i * self.row_stride + t * self.tok_stride);
            if self.accumulate {
                *p += v;
            } else {
                *p = v;
            }
        }
    }
}

impl MatOut<'_> {
    /// Token `t`'s elements as one slice, for a view whose rows are consecutive in memory (a column view of a
    /// [`SharedCols`]): the task that wrote them can read them back, or fill them in place.
    ///
    /// # Panics
    /// If the view's rows are not consecutive, or `t >= n_tok`.
    pub fn token_row(&mut self, t: usize) -> &mut [f32] {
        assert!(
            self.row_stride == 1 && t < self.n_tok,
            "token {t} of a view with row stride {}",
            self.row_stride
        );
        // SAFETY: with a row stride of 1, token `t`'s elements (i < rows) are the `rows` consecutive f32 from
        // `t · tok_stride`, inside the buffer and written by no other live view (the constructors' guarantees);
        // the returned borrow holds `self` mutably, so no `put` can alias it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(t * self.tok_stride), self.rows) }
    }
}

/// A token-major output matrix, `[n_tok][ld]`, shared by the tasks of one split matrix product: each task takes a
/// view of its own columns ([`SharedCols::columns`]).
#[derive(Debug)]
pub struct SharedCols<'a> {
    ptr: *mut f32,
    n_tok: usize,
    ld: usize,
    accumulate: bool,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `SharedCols` only hands out views through `columns`, whose contract makes the views of different
// threads write disjoint elements; `f32` is `Send`.
unsafe impl Sync for SharedCols<'_> {}

impl<'a> SharedCols<'a> {
    /// The first `n_tok` rows of `ld` f32 of `out`; views store, or add onto the contents (`accumulate`).
    ///
    /// # Panics
    /// If `out` holds fewer than `n_tok × ld` elements.
    pub fn new(out: &'a mut [f32], n_tok: usize, ld: usize, accumulate: bool) -> Self {
        assert!(
            n_tok.checked_mul(ld).is_some_and(|n| n <= out.len()),
            "output shorter than {n_tok} x {ld}"
        );
        SharedCols {
            ptr: out.as_mut_ptr(),
            n_tok,
            ld,
            accumulate,
            _borrow: PhantomData,
        }
    }

    /// A view of columns `col0 .. col0 + ncols` for every token: element (row `i`, token `t`) is column
    /// `col0 + i` of token `t`'s row.
    ///
    /// # Safety
    /// While the view lives, no other view of this `SharedCols` may cover any of these columns.
    ///
    /// # Panics
    /// If the columns reach past `ld`.
    pub unsafe fn columns(&self, col0: usize, ncols: usize) -> MatOut<'_> {
        assert!(col0 + ncols <= self.ld, "columns {col0}+{ncols} past {}", self.ld);
        MatOut {
            // SAFETY: `col0 <= ld <= n_tok × ld <= len` (checked in `new` and above), so the offset stays within
            // (or one past) the buffer.
            ptr: unsafe { self.ptr.add(col0) },
            rows: ncols,
            n_tok: self.n_tok,
            row_stride: 1,
            tok_stride: self.ld,
            accumulate: self.accumulate,
            _borrow: PhantomData,
        }
    }
}

/// A zeroed buffer (f32 unless said otherwise) whose first element sits on a 64-byte boundary, so 64-byte vector
/// loads at multiples of 64 bytes never straddle two cache lines. (`Vec<f32>` only promises 4 bytes; glibc puts the
/// large, mmap-backed ones 16 bytes past a page, where every such load of the KV cache crossed a line.)
#[derive(Debug, Clone, Default)]
pub struct AlignedVec<T = f32> {
    buf: Vec<T>,
    skip: usize,
    len: usize,
}

impl<T: Copy + Default> AlignedVec<T> {
    /// `len` zeros (`T::default()`).
    pub fn zeroed(len: usize) -> Self {
        let line = 64 / std::mem::size_of::<T>().max(1);
        let buf = vec![T::default(); len + line];
        let skip = buf.as_ptr().align_offset(64).min(line);
        AlignedVec { buf, skip, len }
    }
}

impl<T> std::ops::Deref for AlignedVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.buf[self.skip..self.skip + self.len]
    }
}

impl<T> std::ops::DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.skip..self.skip + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_vec_starts_on_a_line() {
        for len in [0, 1, 17, 100_000] {
            let h = AlignedVec::<u16>::zeroed(len);
            assert_eq!((h.len(), h.as_ptr() as usize % 64), (len, 0), "u16 len {len}");
            let mut v = AlignedVec::zeroed(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0.0));
            assert_eq!(v.as_ptr() as usize % 64, 0, "len {len}");
            if len > 0 {
                v[len - 1] = 2.0;
                assert_eq!(v[len - 1], 2.0);
            }
        }
    }

    #[test]
    fn views_write_their_own_columns() {
        let mut buf = vec![1f32; 3 * 5];
        {
            let cols = SharedCols::new(&mut buf, 3, 5, true);
            // SAFETY: the two views cover columns 0-1 and 2-4: disjoint.
            let (mut a, mut b) = unsafe { (cols.columns(0, 2), cols.columns(2, 3)) };
            a.put(1, 2, 10.0);
            b.put(0, 0, 5.0);
            b.put(2, 1, 7.0);
        }
        assert_eq!(buf[2 * 5 + 1], 11.0);
        assert_eq!(buf[2], 6.0);
        assert_eq!(buf[5 + 4], 8.0);
        {
            let cols = SharedCols::new(&mut buf, 3, 5, false);
            // SAFETY: the only view.
            let mut v = unsafe { cols.columns(1, 3) };
            v.token_row(2).copy_from_slice(&[4.0, 5.0, 6.0]);
            assert_eq!(v.token_row(2), [4.0, 5.0, 6.0]);
        }
        assert_eq!(buf[2 * 5..], [1.0, 4.0, 5.0, 6.0, 1.0]);
        let mut rm = vec![0f32; 6];
        let mut o = MatOut::row_major(&mut rm, 3);
        o.put(1, 2, 4.0);
        assert_eq!(rm[5], 4.0);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_store_outside_the_view_panics() {
        let mut buf = vec![0f32; 10];
        let cols = SharedCols::new(&mut buf, 2, 5, false);
        // SAFETY: the only view.
        let mut v = unsafe { cols.columns(1, 2) };
        v.put(2, 0, 1.0);
    }
}
