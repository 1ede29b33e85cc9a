//! (placeholder: CPU backend being written)
