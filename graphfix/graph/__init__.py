"""Graph plumbing shared by every wing: the producer/consumer index and batched edits."""
