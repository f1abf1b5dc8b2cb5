"""Classic control (gymnasium) with the same TRPO step as the LLM trainer."""
