"""Feedback on answers: ``ratings`` (👍/👎 and comments, stored and reported) and ``sources``
(the documents each answer cited)."""
