// Prefill on tensor cores (placeholder: filled in by the prefill work).
