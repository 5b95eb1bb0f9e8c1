"""The knowledge base (app/knowledge, docs/knowledge.md): retrieval and answering, and the
optional embeddings and reranking servers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr

from app.config.base import SettingsGroup
from app.config.secret_fields import SHARED, URL


class KnowledgeSettings(SettingsGroup):
    kb_enabled: bool = Field(default=True, description="answer from the knowledge base when it has documents")
    kb_max_upload_bytes: int = Field(default=20 * 1024 * 1024, ge=1024)
    kb_chunk_tokens: int = Field(default=200, ge=40, le=2000, description="largest chunk, in tokens")
    kb_top_k: int = Field(default=4, ge=1, le=20, description="passages put in the prompt")
    kb_passages_in_prompt: bool = Field(
        default=True, description="give the model the retrieved passages (false: the question alone, for a "
                                  "model not trained to read passages; sources and 'not found' still apply)")
    kb_min_score: float = Field(default=0.15, ge=0, le=1,
                                description="relevance threshold (share of the question's weight a "
                                            "passage matches); below it: 'not found' without the "
                                            "model, above it the model may still say so")
    kb_fallback_contact: str = Field(default="", description="the team named when nothing is found")
    kb_mode: Literal["strict", "open"] = Field(
        default="strict", description="nothing relevant found: 'strict' says so and names the team (the demo "
                                      "model); 'open' lets the model answer as a general assistant, marked "
                                      "as not from company documents (a capable model; app/knowledge/modes.py)")
    kb_answer_by_quoting: bool = Field(
        default=False, description="the model's reply must be one passage quoted whole with its number, or "
                                   "'not found' (an extractive model such as the bundled demo; the model "
                                   "server must support guided_choice)")
    kb_quote_unit: Literal["passage", "sentence"] = Field(
        default="passage", description="with KB_ANSWER_BY_QUOTING, what the model quotes: a whole 'passage', "
                                       "or one 'sentence' of one (a line: a bullet, a table row, cut after "
                                       "each sentence), so the answer is the fact asked, not its section")
    kb_choice_scoring: Literal["tokens", "likelihood"] = Field(
        default="likelihood", description="with KB_ANSWER_BY_QUOTING, how the reply is chosen: 'likelihood' "
                                          "(each passage read whole, the likeliest quoted: the bundled engine "
                                          "and `inference serve`) or 'tokens' (constrained decoding, as vLLM's "
                                          "guided_choice)")
    kb_decline_bias: float = Field(
        default=0.0, ge=-5, le=5, description="with KB_CHOICE_SCORING=likelihood: added to the 'not found' "
                                              "replies' score (mean log-probability per token); higher "
                                              "declines more")
    kb_min_similarity: float = Field(default=0.6, ge=-1, le=1,
                                     description="cosine from which a dense match is relevant")
    kb_table_headers: bool = Field(default=True,
                                   description="a table longer than a chunk is cut between rows, each "
                                               "piece under the table's header row (after a change: kb "
                                               "reindex)")
    kb_dense_weight: float = Field(default=1.0, ge=0, le=10,
                                   description="with an embeddings server: the dense ranking's weight in "
                                               "the fusion with BM25's (weight 1); it ranks, never gates")
    kb_server_retry_s: float = Field(default=30.0, ge=0,
                                     description="after the embeddings or reranking server fails, search "
                                                 "without it for this long before trying it again")
    kb_min_relevance: float = Field(default=0.5, ge=-100, le=100,
                                    description="with a reranker: its score from which a passage is relevant "
                                                "(instead of KB_MIN_SCORE / KB_MIN_SIMILARITY)")
    chat_members_cache_s: int = Field(
        default=60, ge=0, le=3600, description="a group chat's member list (appchat/get) is cached this "
                                               "long: a member who joins or leaves counts after it")
    group_scope_max_members: int = Field(
        default=100, ge=1, le=2000, description="a group chat with more members than this gets only the "
                                                "documents visible to everyone (each member is a user/get)")


class KnowledgeServerSettings(SettingsGroup):
    """The embeddings and reranking servers retrieval may use (each off when its URL is empty)."""

    embeddings_base_url: Annotated[str, URL] = Field(
        default="", description="OpenAI-compatible /v1 with /embeddings; empty: BM25 only")
    embeddings_api_key: Annotated[SecretStr, SHARED] = SecretStr("")
    embeddings_model: str = ""
    embeddings_timeout_s: float = Field(default=30.0, gt=0)
    rerank_base_url: Annotated[str, URL] = Field(
        default="", description="a /v1 serving /rerank (Jina / Cohere format, e.g. vLLM with "
                                "bge-reranker-v2-m3); empty: no reranking")
    rerank_api_key: Annotated[SecretStr, SHARED] = SecretStr("")
    rerank_model: str = ""
    rerank_timeout_s: float = Field(default=10.0, gt=0)
    rerank_candidates: int = Field(default=20, ge=1, le=100,
                                   description="the best fused passages the reranker scores")
