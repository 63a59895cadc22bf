"""The experience extractor πϕ (docs/design.md §3.2): prompts and parsing for its three jobs (distil, merge,
refine), the inference wrapper that keeps every answer as a creditable generation, credit assignment and
the training buffer, the CISPO update, and the background track of the dual loop."""
