"""Pieces of the fused_plugin strategy: reading a match into GraphfixAttention's inputs."""
