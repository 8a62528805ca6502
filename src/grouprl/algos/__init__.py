"""Pure math: tensors and floats in, tensors and a metrics dict out. Imports only torch and the registry,
so every formula is tested in milliseconds against hand-worked numbers."""

from grouprl.algos.aggregate import AGGREGATIONS, aggregate, masked_mean
from grouprl.algos.gae import discounted_returns, gae, nstep_returns, whiten
from grouprl.algos.group_advantages import (
    ADVANTAGES,
    SCALES,
    compute_advantages,
    constant_groups,
    constant_rows,
    group_advantages,
    rank_advantages,
    reinforce_advantages,
    rloo_advantages,
)
from grouprl.algos.groups import ByIds, Contiguous, make_groups
from grouprl.algos.kl import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_per_token
from grouprl.algos.losses import (
    IMPORTANCE_LEVELS,
    POLICY_LOSSES,
    clipped_surrogate_loss,
    entropy_from_logits,
    grpo_loss,
    value_loss,
)
from grouprl.algos.natural_gradient import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    get_flat_params,
    natural_step_size,
    set_flat_params,
    trpo_step,
)
from grouprl.algos.policy_losses import cispo_loss, gmpo_loss, sapo_loss
from grouprl.algos.token_selection import entropy_threshold, top_entropy_weights

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "ByIds", "Contiguous", "IMPORTANCE_LEVELS", "KL_ESTIMATORS", "POLICY_LOSSES",
    "SCALES", "AdaptiveKLController", "FixedKLController", "aggregate", "backtracking_line_search", "cispo_loss",
    "clipped_surrogate_loss", "compute_advantages", "conjugate_gradient", "constant_groups", "constant_rows",
    "discounted_returns", "entropy_from_logits", "entropy_threshold", "fisher_vector_product", "flat_grad", "gae",
    "get_flat_params", "gmpo_loss", "group_advantages", "grpo_loss", "kl_per_token", "make_groups", "masked_mean",
    "natural_step_size", "nstep_returns", "rank_advantages", "reinforce_advantages", "rloo_advantages", "sapo_loss",
    "set_flat_params", "top_entropy_weights", "trpo_step", "value_loss", "whiten",
]
