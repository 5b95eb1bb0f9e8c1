"""The model server: `python -m inference serve` (`serve.py`), OpenAI's chat completions over one
engine, with `/v1/embeddings` over an embedder when asked (`embeddings.py`), and OpenAI's error
shape for both (`errors.py`)."""
