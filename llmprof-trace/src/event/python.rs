//! Python frames of a stack sample, resolved (function, file, line), and [`merge_stacks`]: splicing them
//! into the native frames of the same sample where the interpreter's eval frames sit.
//!
//! Owns the resolved Python frame model and the merge rule; pure (no /proc, no kernel). Capture resolves
//! the kernel's raw frames (code object address + instruction) into [`PyFrame`]s; the native stack sampler's
//! sink calls [`merge_stacks`] with its own frame type.

use std::sync::Arc;

use crate::event::stacks::{CpuSample, Frame, FrameKind};

/// One resolved Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrame {
    /// `co_qualname` (3.11+) or `co_name` (3.10); `<unknown>` when the code object could not be read.
    pub function: String,
    /// `co_filename` as the interpreter holds it.
    pub file: String,
    /// Line of the instruction being executed (None: no line for it, or unreadable).
    pub line: Option<u32>,
    /// The first frame its C eval call (`_PyEval_EvalFrameDefault`) ran: the native eval frame running
    /// this frame and the non-entry frames inside it (innermost ones) sits below it.
    pub entry: bool,
}

impl PyFrame {
    /// `function (file:line)`, the file shortened to its last component, as the trace shows a frame.
    pub fn label(&self) -> String {
        let file = self.file.rsplit('/').next().unwrap_or(&self.file);
        match self.line {
            Some(l) => format!("{} ({file}:{l})", self.function),
            None => format!("{} ({file})", self.function),
        }
    }
}

/// Why a sample has no (or not all) Python frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyStackStatus {
    /// Walked to the outermost frame.
    Complete,
    /// More frames than the kernel keeps: the outermost ones are missing.
    Truncated,
    /// The thread has no Python thread state (not a Python thread, or started since the last refresh).
    NoThread,
    /// A read of the process's memory failed in the kernel (paged out, or the chain changed under it).
    ReadFailed,
}

/// The Python stack of one thread at one sample, innermost frame first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyStackSample {
    /// The frames, innermost first.
    pub frames: Vec<PyFrame>,
    /// How the walk ended.
    pub status: PyStackStatus,
}

impl PyStackSample {
    /// The frames as one line, innermost first: `h (burn.py:16) ← g (burn.py:21) ← f (burn.py:26)`.
    pub fn render(&self) -> String {
        self.frames
            .iter()
            .map(PyFrame::label)
            .collect::<Vec<_>>()
            .join(" ← ")
    }
}

/// Whether a native symbol is CPython's bytecode eval loop, the C frame Python frames run in (3.10–3.13
/// name it `_PyEval_EvalFrameDefault`; a compiler's cold part keeps the name with a `.cold` suffix).
pub fn is_eval_symbol(name: &str) -> bool {
    name == "_PyEval_EvalFrameDefault" || name.starts_with("_PyEval_EvalFrameDefault.")
}

/// A frame of a merged stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergedFrame<'a, N> {
    /// A native frame (kernel or user).
    Native(&'a N),
    /// A Python frame.
    Python(&'a PyFrame),
}

/// Merges one sample's native frames and Python frames (both innermost first) into one stack, innermost
/// first, so it reads `h (burn.py) ← g ← f ← PyObject_Call ← ... ← main` or, for a native library called from
/// Python, `ggml_graph_compute ← llama_decode ← eval (llama.py) ← generate (llama.py) ← ...`.
///
/// Rule: the Python frames form groups, each ending at an [`PyFrame::entry`] frame (the frames one C eval
/// call ran; every frame is its own group in 3.10). Walking the native frames from the leaf, each native
/// eval frame (`is_eval(frame)`, e.g. [`is_eval_symbol`] of its symbol) is replaced by the next group. When
/// the native stack ends first (a binary without frame pointers, where a frame-pointer walk stops after a
/// few frames), the remaining groups follow it, in order: Python frames are outer to every native frame that
/// was seen. Native eval frames left without a group (more eval calls than Python frames seen) stay as they
/// are.
pub fn merge_stacks<'a, N>(
    native: &'a [N],
    is_eval: impl Fn(&N) -> bool,
    python: &'a [PyFrame],
) -> Vec<MergedFrame<'a, N>> {
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut next_py = 0;
    let push_group = |out: &mut Vec<MergedFrame<'a, N>>, next_py: &mut usize| {
        while *next_py < python.len() {
            let f = &python[*next_py];
            out.push(MergedFrame::Python(f));
            *next_py += 1;
            if f.entry {
                break;
            }
        }
    };
    for n in native {
        if next_py < python.len() && is_eval(n) {
            push_group(&mut out, &mut next_py);
        } else {
            out.push(MergedFrame::Native(n));
        }
    }
    while next_py < python.len() {
        push_group(&mut out, &mut next_py);
    }
    out
}

/// Splices a sample's Python frames into its native stack ([`merge_stacks`] with [`is_eval_symbol`]): each
/// Python frame becomes an [`FrameKind::Interpreted`] frame (function, file as its module and source file,
/// line), so a flame graph reads `h (burn.py) ← g ← f ← ...` where the interpreter's eval frames were.
pub fn splice(sample: &mut CpuSample, py: &PyStackSample) {
    if py.frames.is_empty() {
        return;
    }
    let merged: Vec<Arc<Frame>> = merge_stacks(&sample.frames, |f| is_eval_symbol(&f.function), &py.frames)
        .into_iter()
        .map(|m| match m {
            MergedFrame::Native(n) => n.clone(),
            MergedFrame::Python(p) => {
                let mut f = Frame::named(&p.function, &p.file, FrameKind::Interpreted);
                f.file = Some(Arc::from(p.file.as_str()));
                f.line = p.line;
                Arc::new(f)
            }
        })
        .collect();
    sample.frames = merged;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(function: &str, entry: bool) -> PyFrame {
        PyFrame {
            function: function.into(),
            file: "/srv/llama.py".into(),
            line: Some(7),
            entry,
        }
    }

    fn names<'a>(m: &[MergedFrame<'a, &'a str>]) -> Vec<&'a str> {
        m.iter()
            .map(|f| match f {
                MergedFrame::Native(n) => **n,
                MergedFrame::Python(p) => p.function.as_str(),
            })
            .collect()
    }

    #[test]
    fn python_frames_replace_the_eval_frames_group_by_group() {
        // 3.11+: `eval` and `generate` ran in one C eval call (generate is its entry frame), `main` in another.
        let native = [
            "ggml_graph_compute",
            "llama_decode",
            "ffi_call",
            "_PyEval_EvalFrameDefault",
            "PyObject_Vectorcall",
            "_PyEval_EvalFrameDefault",
            "Py_RunMain",
            "main",
        ];
        let python = [py("eval", false), py("generate", true), py("main_py", true)];
        let m = merge_stacks(&native, |n| is_eval_symbol(n), &python);
        assert_eq!(
            names(&m),
            [
                "ggml_graph_compute",
                "llama_decode",
                "ffi_call",
                "eval",
                "generate",
                "PyObject_Vectorcall",
                "main_py",
                "Py_RunMain",
                "main"
            ]
        );
    }

    #[test]
    fn a_truncated_native_stack_gets_the_python_frames_outside_it() {
        let native = ["ggml_graph_compute", "llama_decode"];
        let python = [py("eval", false), py("generate", true)];
        let m = merge_stacks(&native, |n| is_eval_symbol(n), &python);
        assert_eq!(
            names(&m),
            ["ggml_graph_compute", "llama_decode", "eval", "generate"]
        );
    }

    #[test]
    fn one_group_per_frame_in_310_and_spare_eval_frames_stay() {
        let native = [
            "_PyEval_EvalFrameDefault",
            "_PyEval_EvalFrameDefault.cold",
            "_PyEval_EvalFrameDefault",
            "main",
        ];
        let python = [py("h", true), py("g", true)];
        let m = merge_stacks(&native, |n| is_eval_symbol(n), &python);
        assert_eq!(names(&m), ["h", "g", "_PyEval_EvalFrameDefault", "main"]);
    }

    #[test]
    fn labels_use_the_file_name() {
        let s = PyStackSample {
            frames: vec![py("h", true), py("g", true)],
            status: PyStackStatus::Complete,
        };
        assert_eq!(s.render(), "h (llama.py:7) ← g (llama.py:7)");
    }

    #[test]
    fn splice_puts_interpreted_frames_where_the_eval_loop_was() {
        let native = |n: &str| Arc::new(Frame::named(n, "/usr/lib/libpython3.11.so", FrameKind::Native));
        let mut sample = CpuSample {
            cpu: 0,
            frames: vec![
                native("PyLong_Add"),
                native("_PyEval_EvalFrameDefault"),
                native("main"),
            ],
            truncated: false,
        };
        let py = PyStackSample {
            frames: vec![py("h", false), py("g", false), py("<module>", true)],
            status: PyStackStatus::Complete,
        };
        splice(&mut sample, &py);
        let got: Vec<(&str, FrameKind)> = sample.frames.iter().map(|f| (&*f.function, f.kind)).collect();
        assert_eq!(
            got,
            [
                ("PyLong_Add", FrameKind::Native),
                ("h", FrameKind::Interpreted),
                ("g", FrameKind::Interpreted),
                ("<module>", FrameKind::Interpreted),
                ("main", FrameKind::Native),
            ]
        );
        assert_eq!(sample.frames[1].file.as_deref(), Some("/srv/llama.py"));
        assert_eq!(sample.frames[1].line, Some(7));
        // No Python frames: the sample is left as it was.
        let before = sample.clone();
        splice(
            &mut sample,
            &PyStackSample {
                frames: Vec::new(),
                status: PyStackStatus::NoThread,
            },
        );
        assert_eq!(sample, before);
    }
}
