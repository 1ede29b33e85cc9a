//! Model-file path patterns (`--model-path`): parsing user patterns into the kernel's `FilePattern`s.
//!
//! The kernel only does bounded literal compares, so a pattern is a literal with at most one `*`, at its
//! start (suffix match: `*.gguf`) or at its end (prefix match: `/models/*`); a pattern without `*` matches
//! paths that end with it.

use llmprof_abi::{FilePattern, MAX_PATTERNS, PATTERN_LEN, PatternKind};

/// The default patterns: the weight-file formats of llama.cpp, safetensors and PyTorch.
pub const DEFAULT_MODEL_PATTERNS: [&str; 5] = ["*.gguf", "*.safetensors", "*.bin", "*.pt", "*.pth"];

/// Why a pattern was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatternError {
    /// The pattern has a `*` in the middle, or two of them.
    #[error(
        "model-path pattern {0:?} is not supported: use one `*` at the start (*.gguf) or at the end (/models/*)"
    )]
    Unsupported(String),
    /// Empty, or longer than the kernel's limit.
    #[error("model-path pattern {0:?} must have 1 to {PATTERN_LEN} characters besides `*`")]
    Length(String),
    /// More patterns than the kernel's table holds.
    #[error("at most {MAX_PATTERNS} model-path patterns are supported, got {0}")]
    TooMany(usize),
}

/// Parses one pattern.
pub fn parse(p: &str) -> Result<FilePattern, PatternError> {
    let stars = p.matches('*').count();
    let (kind, lit) = match (stars, p.strip_prefix('*'), p.strip_suffix('*')) {
        (0, _, _) => (PatternKind::Suffix, p),
        (1, Some(rest), _) => (PatternKind::Suffix, rest),
        (1, None, Some(rest)) => (PatternKind::Prefix, rest),
        _ => return Err(PatternError::Unsupported(p.to_string())),
    };
    if lit.is_empty() || lit.len() > PATTERN_LEN {
        return Err(PatternError::Length(p.to_string()));
    }
    let mut bytes = [0u8; PATTERN_LEN];
    bytes[..lit.len()].copy_from_slice(lit.as_bytes());
    Ok(FilePattern {
        kind: kind as u32,
        len: lit.len() as u32,
        bytes,
    })
}

/// Parses all patterns for the kernel's table.
pub fn parse_all(ps: &[String]) -> Result<Vec<FilePattern>, PatternError> {
    if ps.len() > MAX_PATTERNS {
        return Err(PatternError::TooMany(ps.len()));
    }
    ps.iter().map(|p| parse(p)).collect()
}

/// The same match the kernel does, for user-space checks and tests.
pub fn matches(pat: &FilePattern, path: &str) -> bool {
    let lit = &pat.bytes[..pat.len as usize];
    if pat.kind == PatternKind::Suffix as u32 {
        path.as_bytes().ends_with(lit)
    } else if pat.kind == PatternKind::Prefix as u32 {
        path.as_bytes().starts_with(lit)
    } else {
        false
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_weight_files_only() {
        let pats: Vec<String> = DEFAULT_MODEL_PATTERNS.iter().map(|s| s.to_string()).collect();
        let pats = parse_all(&pats).unwrap();
        let any = |p: &str| pats.iter().any(|f| matches(f, p));
        assert!(any("/models/smollm2.gguf") && any("model-00001.safetensors") && any("x.pth"));
        assert!(!any("/etc/passwd") && !any("/models/tokenizer.json"));
    }

    #[test]
    fn prefix_and_errors() {
        let p = parse("/models/*").unwrap();
        assert!(matches(&p, "/models/a/b") && !matches(&p, "/tmp/models/a"));
        assert!(matches!(parse("a*b"), Err(PatternError::Unsupported(_))));
        assert!(matches!(parse("*"), Err(PatternError::Length(_))));
        let many: Vec<String> = (0..9).map(|i| format!("*.{i}")).collect();
        assert_eq!(parse_all(&many).unwrap_err(), PatternError::TooMany(9));
    }
}
