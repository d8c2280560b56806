"""Finding attention chains and rewriting them: matcher, match records, strategies, reports."""
