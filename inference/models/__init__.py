"""One file per architecture; `MODELS` maps a config's `model_type` to its class."""

from inference.models.glm4 import Glm4ForCausalLM
from inference.models.glm4_moe import Glm4MoeForCausalLM
from inference.models.glm4_moe_lite import Glm4MoeLiteForCausalLM
from inference.models.glm5_next import Glm5NextForCausalLM
from inference.models.glm5_sparse import Glm5SparseForCausalLM
from inference.models.glm_moe_dsa import GlmMoeDsaForCausalLM

MODELS = {"glm5_sparse": Glm5SparseForCausalLM, "glm4": Glm4ForCausalLM, "glm4_moe": Glm4MoeForCausalLM,
          "glm4_moe_lite": Glm4MoeLiteForCausalLM, "glm_moe_dsa": GlmMoeDsaForCausalLM,
          "glm5_next": Glm5NextForCausalLM}
