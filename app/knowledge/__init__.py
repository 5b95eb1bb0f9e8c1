"""The knowledge base: documents the company uploads, searched to ground the bot's answers.

- ``parsing``: bytes of an upload -> blocks (headings, paragraphs), the type found by content;
- ``chunking``: blocks -> chunks of a bounded size in tokens, each with its heading path;
- ``terms``: the words of a text (jieba for Chinese, lower-cased English and numbers) and the
  keyed hashes the index stores instead of the words; ``glossary``: Chinese <-> English office
  words, so a question in one language finds a passage in the other;
- ``store``: add / replace / remove documents (sealed text, hashed postings, audited);
- ``retrieval``: BM25 over the postings of the documents the employee may see, fused with
  ``embeddings`` (optional dense vectors from an OpenAI-compatible /v1/embeddings server);
- ``prompt``: numbered passages into the model's messages, the sources line, the "not found" reply.

Nothing here stores a word of a document in clear: text is AES-GCM sealed like messages, and the
index holds HMACs of terms (``docs/knowledge.md`` says what that still reveals).
"""
