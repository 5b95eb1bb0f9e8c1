"""The audit log: ``chain`` (events in one hash chain), ``checks`` (what verify checks),
``head`` (the chain's head and its copy outside), ``keys`` (the MAC keys), ``signing``
(Ed25519 signatures of exports)."""
