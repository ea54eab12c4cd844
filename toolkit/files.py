"""Writing a file so that a process killed at any instant leaves either the whole new file or the old one, never
a torn one that the next command would read as current (a report `toolkit register` attaches, a job record, a cache).
One helper for the toolkit and the training code: the training package's (the training code imports no toolkit).
"""

from toolkit_train.layout import write_atomically

__all__ = ["write_atomically"]
