"""Grammar-constrained decoding on llguidance (issue 27).

- compile.py: JSON schema / regex / Lark / choice -> a compiled grammar, cached by the hash
  of its source; bad sources raise GrammarError naming the failing schema path.
- matcher.py: one request's matcher; the next token mask is computed on the grammar thread
  while the forward runs, then applied to the logits on their device before sampling.
- tools.py: the tool-call grammars of the hermes and Kimi K2 chat families.
- loop_guard.py: a JSON reply that loops, or nears its max_tokens, is closed at the grammar's
  first chance; closing.py: the literal tails that close a pattern's string.
- strict.py: OpenAI's `strict: true` closes the schema's objects.
"""
