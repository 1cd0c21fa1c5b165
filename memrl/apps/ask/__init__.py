"""Ask a memory agent about your own documents (`memrl ask`, `memrl serve`, `ask()`).

`ask(model, documents, question)` reads documents of any length (text, Markdown, HTML, PDF,
or strings) chunk by chunk with MemAgent and returns the answer with the memory after each
chunk; `aask` is the same as a coroutine on a shared engine. See `memrl.apps.ask.api`.
"""

from memrl.apps.ask.api import AskProgress, AskResult, Usage, aask, ask

__all__ = ["AskProgress", "AskResult", "Usage", "aask", "ask"]
