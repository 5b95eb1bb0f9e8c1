"""The bundled demo model: its handbook corpus (`corpus`), training (`train`, `train_embedder`) and
scoring (`eval`, `eval_sets`), and the grounded samples it learns from (`grounded`).

Outside `inference/`: it reads the knowledge base (`app.knowledge`) as the worker does, and the
engine stands alone. `python -m demo.train`, `python -m demo.eval [--questions FILE --json]`,
`python -m demo.train_embedder`.
"""
