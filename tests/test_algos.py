"""Hand-computed values for the math of role-wise GRPO (envace.math.algos), plus loop references on random data."""

from __future__ import annotations

import math

import pytest
import torch

from envace.math.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    aggregate,
    kl_k3,
    loss_normalizer,
    policy_loss,
    rollout_correction,
    sft_loss,
    token_logprobs,
)
from envace.core.registry import UnknownNameError

ACT, REH = 0, 1


def _example_group():
    """Group 0 of the brief: trajectory a (R=1): 3 act rows + 1 rehearse row; trajectory b (R=0): 1 act row +
    2 rehearse rows. Group 1: two trajectories (R=0.5 and R=0.0), one act row each, far from group 0."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 1])
    roles = torch.tensor([ACT, ACT, ACT, REH, ACT, REH, REH, ACT, ACT])
    return rewards, groups, roles


def test_registries_list_the_valid_names():
    assert ADVANTAGES.names() == ["pooled", "pooled_std", "rolewise", "rolewise_std"]
    assert AGGREGATIONS.names() == ["seq_mean", "token_mean"]
    with pytest.raises(UnknownNameError, match="rolewise"):
        ADVANTAGES.get("nope")


def test_rolewise_baseline_is_row_weighted_per_group_and_role():
    rewards, groups, roles = _example_group()
    adv, m = ADVANTAGES.get("rolewise")(rewards, groups, roles)
    # group 0: act mu = (1+1+1+0)/4 = 0.75, rehearse mu = (1+0+0)/3 = 1/3; group 1 act mu = 0.25
    expected = [0.25, 0.25, 0.25, 2 / 3, -0.75, -1 / 3, -1 / 3, 0.25, -0.25]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert m["n_cells"] == 3 and m["n_valid_rows"] == 9 and m["n_invalid_rows"] == 0


def test_rolewise_std_divides_by_population_std_of_the_cell():
    rewards, groups, roles = _example_group()
    adv, _ = ADVANTAGES.get("rolewise_std")(rewards, groups, roles, eps=0.0)
    # act cell of group 0: std = sqrt(0.1875) -> +0.25/std = 1/sqrt(3), -0.75/std = -sqrt(3)
    # rehearse cell: std = sqrt(2)/3 -> (2/3)/std = sqrt(2), (-1/3)/std = -1/sqrt(2)
    # group 1: std = 0.25 -> +1, -1
    s3, s2 = math.sqrt(3), math.sqrt(2)
    expected = [1 / s3, 1 / s3, 1 / s3, s2, -s3, -1 / s2, -1 / s2, 1.0, -1.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)


def test_pooled_uses_one_baseline_over_all_roles_of_the_group():
    rewards, groups, roles = _example_group()
    adv, m = ADVANTAGES.get("pooled")(rewards, groups, roles)
    # group 0: mu = 4/7 over 7 rows
    expected = [3 / 7] * 4 + [-4 / 7] * 3 + [0.25, -0.25]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert m["n_cells"] == 2
    adv_std, _ = ADVANTAGES.get("pooled_std")(rewards, groups, roles, eps=0.0)
    # std = sqrt(4/7 * 3/7) = sqrt(12)/7 -> 3/sqrt(12) = sqrt(3)/2, -4/sqrt(12)
    expected_std = [math.sqrt(3) / 2] * 4 + [-4 / math.sqrt(12)] * 3 + [1.0, -1.0]
    assert adv_std.tolist() == pytest.approx(expected_std, abs=1e-5)


def test_invalid_rows_are_excluded_from_the_baseline_and_get_zero():
    rewards, groups, roles = _example_group()
    # an unscored trajectory in group 0 with 2 act rows and 1 rehearse row; its reward is NaN
    rewards = torch.cat([rewards, torch.tensor([float("nan")] * 3)])
    groups = torch.cat([groups, torch.tensor([0, 0, 0])])
    roles = torch.cat([roles, torch.tensor([ACT, ACT, REH])])
    valid = torch.tensor([True] * 9 + [False] * 3)
    for name in ADVANTAGES:
        adv, m = ADVANTAGES.get(name)(rewards, groups, roles, valid)
        ref, _ = ADVANTAGES.get(name)(rewards[:9], groups[:9], roles[:9])
        assert torch.isfinite(adv).all(), name
        assert adv[9:].tolist() == [0.0, 0.0, 0.0], name
        assert torch.allclose(adv[:9], ref), name
        assert m["n_invalid_rows"] == 3 and m["n_valid_rows"] == 9


def test_constant_or_singleton_cells_give_zero_advantage_not_nan():
    rewards = torch.tensor([1.0, 1.0, 0.3])
    groups = torch.tensor([0, 0, 1])
    roles = torch.tensor([ACT, ACT, REH])
    for name in ADVANTAGES:
        adv, m = ADVANTAGES.get(name)(rewards, groups, roles)
        assert adv.tolist() == [0.0, 0.0, 0.0], name
        assert m["adv_zero_frac"] == 1.0


def test_a_cell_with_only_invalid_rows_and_an_empty_batch():
    adv, m = ADVANTAGES.get("rolewise")(
        torch.tensor([0.7, 0.2]), torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([True, False])
    )
    assert adv.tolist() == [0.0, 0.0] and m["n_cells"] == 1
    empty = torch.zeros(0)
    adv, m = ADVANTAGES.get("rolewise_std")(empty, empty.long(), empty.long())
    assert adv.shape == (0,) and m["n_valid_rows"] == 0


def test_advantage_inputs_must_share_one_shape():
    with pytest.raises(ValueError, match="roles"):
        ADVANTAGES.get("rolewise")(torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.long))


def _loop_advantages(rewards, groups, roles, valid, by_role, scale, eps):
    """Readable reference: dictionaries of lists, one row at a time."""
    cells: dict[tuple, list[float]] = {}
    for r, g, ro, v in zip(rewards.tolist(), groups.tolist(), roles.tolist(), valid.tolist()):
        if v:
            cells.setdefault((g, ro) if by_role else (g,), []).append(r)
    out = []
    for r, g, ro, v in zip(rewards.tolist(), groups.tolist(), roles.tolist(), valid.tolist()):
        if not v:
            out.append(0.0)
            continue
        xs = cells[(g, ro) if by_role else (g,)]
        mu = sum(xs) / len(xs)
        a = r - mu
        if scale:
            std = math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs))
            a = a / (std + eps)
        out.append(a)
    return out


@pytest.mark.parametrize(
    "name,by_role,scale",
    [("rolewise", True, False), ("rolewise_std", True, True), ("pooled", False, False), ("pooled_std", False, True)],
)
def test_vectorised_advantages_match_the_loop_reference(name, by_role, scale):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 60, (1,), generator=g))
        rewards = torch.randint(0, 3, (n,), generator=g).double() / 2  # ties are common, as with 0/1 rewards
        groups = torch.randint(0, 5, (n,), generator=g) * 7  # non-contiguous group ids
        roles = torch.randint(0, 3, (n,), generator=g)
        valid = torch.rand(n, generator=g, dtype=torch.float64) > 0.2
        adv, _ = ADVANTAGES.get(name)(rewards, groups, roles, valid, eps=1e-6)
        assert adv.tolist() == pytest.approx(
            _loop_advantages(rewards, groups, roles, valid, by_role, scale, 1e-6), abs=1e-9
        )


# ---------------------------------------------------------------------------------------------- policy loss


def _clip_case():
    """Row 0 has A=+1, row 1 has A=-1; token ratios are [1.5, 0.5] in both rows; eps = 0.2.
    Per-token loss -min(rho*A, clip(rho)*A):
      row 0: rho=1.5 -> -1.2 (clipped, no grad); rho=0.5 -> -0.5 (unclipped, d/dlogp = -0.5)
      row 1: rho=1.5 -> +1.5 (unclipped, d/dlogp = +1.5); rho=0.5 -> +0.8 (clipped, no grad)
    A third, masked token with a wild ratio must change nothing."""
    old = torch.log(torch.tensor([[0.2, 0.4, 0.5], [0.2, 0.4, 0.5]]))
    new = torch.log(torch.tensor([[0.3, 0.2, 0.9999], [0.3, 0.2, 1e-9]]))
    logp = new.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    return logp, old, adv, mask


def test_clipped_surrogate_hand_values_and_gradients():
    logp, old, adv, mask = _clip_case()
    loss, m = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4, abs=1e-6)  # 0.15
    loss.backward()
    expected_grad = [[0.0, -0.5 / 4, 0.0], [1.5 / 4, 0.0, 0.0]]
    assert logp.grad.flatten().tolist() == pytest.approx(sum(expected_grad, []), abs=1e-6)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx(1.0)
    assert m["ratio_max"] == pytest.approx(1.5)
    # k3 of KL(old||new): (1.5 - 1 - ln 1.5) = 0.0945349, (0.5 - 1 + ln 2) = 0.1931472
    assert m["approx_kl"] == pytest.approx((0.0945349 + 0.1931472) / 2, abs=1e-6)
    assert m["n_tokens"] == 4


def test_clip_higher_widens_only_the_upper_bound():
    logp, old, adv, mask = _clip_case()
    loss, m = policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.6)
    # row 0 token 0: rho = 1.5 < 1.6 is no longer clipped: -1.5 instead of -1.2
    assert loss.item() == pytest.approx((-1.5 - 0.5 + 1.5 + 0.8) / 4, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(0.25)


def test_token_mean_and_seq_mean_weigh_rows_differently():
    logp, old, adv, _ = _clip_case()
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)  # row 1 keeps one token
    tok, _ = policy_loss(logp, old, adv, mask, agg="token_mean")
    seq, _ = policy_loss(logp, old, adv, mask, agg="seq_mean")
    assert tok.item() == pytest.approx((-1.2 - 0.5 + 1.5) / 3, abs=1e-6)  # -0.0666...
    assert seq.item() == pytest.approx(((-1.2 - 0.5) / 2 + 1.5 / 1) / 2, abs=1e-6)  # 0.325


def test_zero_advantage_gives_zero_loss_and_zero_gradient():
    logp, old, _, mask = _clip_case()
    loss, _ = policy_loss(logp, old, torch.zeros(2), mask)
    loss.backward()
    assert loss.item() == 0.0 and logp.grad.abs().sum().item() == 0.0


def test_on_policy_gradient_is_minus_advantage_over_token_count():
    # ratio = 1 everywhere: d loss / d logp = -A / n_tokens on every unmasked token
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, m = policy_loss(logp, logp.detach().clone(), torch.tensor([2.0, -1.0]), mask)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, -0.5, 0.25, 0.0, 0.0])
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == pytest.approx(0.0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batch_losses_with_the_batch_normalizer_sum_to_the_full_batch_loss(agg):
    g = torch.Generator().manual_seed(1)
    rows, T = 6, 7
    logp0 = -torch.rand(rows, T, generator=g) * 3
    old = logp0 + 0.3 * torch.randn(rows, T, generator=g)
    adv = torch.randn(rows, generator=g)
    lengths = torch.tensor([7, 1, 4, 0, 5, 2])  # one empty row
    mask = torch.arange(T)[None, :] < lengths[:, None]

    full_logp = logp0.clone().requires_grad_(True)
    full, _ = policy_loss(full_logp, old, adv, mask, agg=agg)
    full.backward()

    parts = [slice(0, 2), slice(2, 3), slice(3, 6)]
    norm = sum(loss_normalizer(mask[s], agg) for s in parts)
    assert (
        norm == loss_normalizer(mask, agg) == (19.0 if agg == "token_mean" else 5.0)
    )  # 7+1+4+0+5+2 tokens, 5 non-empty rows
    acc_logp = logp0.clone().requires_grad_(True)
    total = 0.0
    for s in parts:
        part, _ = policy_loss(acc_logp[s], old[s], adv[s], mask[s], agg=agg, normalizer=norm)
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(acc_logp.grad, full_logp.grad, atol=1e-7)
    # without the batch normalizer the micro-batch means do NOT add up (the trap the normalizer avoids)
    naive = sum(policy_loss(logp0[s], old[s], adv[s], mask[s], agg=agg)[0].item() for s in parts)
    assert naive != pytest.approx(full.item(), abs=1e-3)


def _loop_policy_loss(logp, old, adv, mask, eps, eps_high, agg, weights=None):
    """Readable reference: one token at a time (each token's loss times ``weights[i, t]`` when given)."""
    row_means, tok_sum, n_tok = [], 0.0, 0
    for i in range(logp.shape[0]):
        s, n = 0.0, 0
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            rho = math.exp(logp[i, t].item() - old[i, t].item())
            a = adv[i].item()
            obj = min(rho * a, min(max(rho, 1 - eps), 1 + eps_high) * a)
            s += -obj * (1.0 if weights is None else weights[i, t].item())
            n += 1
        tok_sum += s
        n_tok += n
        if n:
            row_means.append(s / n)
    if agg == "token_mean":
        return tok_sum / max(n_tok, 1)
    return sum(row_means) / max(len(row_means), 1)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_vectorised_policy_loss_matches_the_loop_reference(agg):
    g = torch.Generator().manual_seed(2)
    for _ in range(10):
        rows, T = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        logp = -torch.rand(rows, T, generator=g, dtype=torch.float64) * 2
        old = logp + 0.5 * torch.randn(rows, T, generator=g, dtype=torch.float64)
        adv = torch.randn(rows, generator=g, dtype=torch.float64)
        mask = torch.rand(rows, T, generator=g) > 0.3
        loss, _ = policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28, agg=agg)
        assert loss.item() == pytest.approx(_loop_policy_loss(logp, old, adv, mask, 0.2, 0.28, agg), abs=1e-10)
        sampler = old + 0.5 * torch.randn(rows, T, generator=g, dtype=torch.float64)
        w, _ = rollout_correction(old, sampler, mask, cap=2.0)
        loss, _ = policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28, agg=agg, is_weights=w)
        ref = _loop_policy_loss(logp, old, adv, mask, 0.2, 0.28, agg, weights=(sampler - old).neg().exp().clamp(max=2))
        assert loss.item() == pytest.approx(ref, abs=1e-10)


def test_policy_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="adv"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 2))


def test_aggregate_rejects_a_non_positive_normalizer_and_unknown_names():
    with pytest.raises(ValueError, match="normalizer"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "token_mean", normalizer=0.0)
    with pytest.raises(UnknownNameError, match="seq_mean, token_mean"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "sum")


# ---------------------------------------------------------------------------------------------- rollout correction


def _mismatch_case():
    """The tokens of :func:`_clip_case`, sampled by a policy other than pi_old: r = pi_old / pi_sampler is
    4 and 0.8 on row 0, 1 and 0.5 on row 1; the masked third token's sampler log-prob is wild."""
    logp, old, adv, mask = _clip_case()
    sampler = torch.log(torch.tensor([[0.05, 0.5, 1e-9], [0.2, 0.8, 1e-9]]))
    return logp, old, adv, mask, sampler


def test_rollout_correction_changes_nothing_when_sampler_and_trainer_agree():
    logp, old, adv, mask = _clip_case()
    w, m = rollout_correction(old, old.clone(), mask, cap=2.0)
    assert torch.equal(w, torch.ones_like(w))
    assert m == {"kl": 0.0, "clipped_share": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0, "n_tokens": 4.0}
    plain_logp = logp.detach().clone().requires_grad_(True)
    plain, _ = policy_loss(plain_logp, old, adv, mask)
    corrected, _ = policy_loss(logp, old, adv, mask, is_weights=w)
    assert corrected.item() == plain.item() == pytest.approx(0.15, abs=1e-6)  # the hand value of the clip case
    plain.backward()
    corrected.backward()
    assert torch.equal(logp.grad, plain_logp.grad)


def test_truncated_importance_weights_hand_values_and_gradients():
    """Weights min(r, 2): row 0 [2, 0.8], row 1 [1, 0.5]; the clip case's per-token losses [-1.2, -0.5] and
    [1.5, 0.8] become [-2.4, -0.4] and [1.5, 0.4]; the gradients of the unclipped tokens are scaled by w."""
    logp, old, adv, mask, sampler = _mismatch_case()
    w, m = rollout_correction(old, sampler, mask, cap=2.0)
    assert w.tolist() == [pytest.approx([2.0, 0.8, 1.0]), pytest.approx([1.0, 0.5, 1.0])]  # 1 on padding
    loss, pm = policy_loss(logp, old, adv, mask, clip_eps=0.2, is_weights=w)
    assert loss.item() == pytest.approx((-2.4 - 0.4 + 1.5 + 0.4) / 4, abs=1e-6)  # -0.225
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -0.5 * 0.8 / 4, 0.0, 1.5 / 4, 0.0, 0.0], abs=1e-6)
    assert pm["clip_frac"] == pytest.approx(0.5)  # the PPO clip is the trainer's business, unchanged
    # k3 of KL(sampler || old), r - 1 - ln r: 4 -> 3 - ln 4; 0.8 -> -0.2 - ln 0.8; 1 -> 0; 0.5 -> -0.5 + ln 2
    assert m["kl"] == pytest.approx((1.6137056 + 0.0231436 + 0.0 + 0.1931472) / 4, abs=1e-6)
    assert m["clipped_share"] == pytest.approx(0.25) and m["n_tokens"] == 4.0
    assert m["ratio_mean"] == pytest.approx((4 + 0.8 + 1 + 0.5) / 4) and m["ratio_max"] == pytest.approx(4.0)


def test_the_cap_bounds_the_weights_and_counts_what_it_cut():
    _, old, _, mask, sampler = _mismatch_case()
    for cap, w00, share in ((1.0, 1.0, 0.25), (2.0, 2.0, 0.25), (5.0, 4.0, 0.0), (math.inf, 4.0, 0.0)):
        w, m = rollout_correction(old, sampler, mask, cap=cap)
        assert w[0, 0].item() == pytest.approx(w00) and w.max().item() <= cap
        assert w[0, 1].item() == pytest.approx(0.8) and m["clipped_share"] == pytest.approx(share)
    for cap in (0.5, 0.0, float("nan")):
        with pytest.raises(ValueError, match="cap"):
            rollout_correction(old, sampler, mask, cap=cap)


def test_the_weights_carry_no_gradient():
    logp, old, adv, mask, sampler = _mismatch_case()
    old_g = old.clone().requires_grad_(True)
    w, _ = rollout_correction(old_g, sampler, mask, cap=2.0)
    assert not w.requires_grad
    w_g = w.clone().requires_grad_(True)
    policy_loss(logp, old, adv, mask, is_weights=w_g)[0].backward()
    assert w_g.grad is None and logp.grad is not None
    with pytest.raises(ValueError, match="is_weights"):
        policy_loss(logp, old, adv, mask, is_weights=w[:, :2])


# ---------------------------------------------------------------------------------------------- KL, SFT, log-probs


def test_k3_hand_values():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.4]]))
    ref = torch.log(torch.tensor([[0.5, 0.4, 0.2]]))
    # d = ref - logp: 0 -> 0;  ln 2 -> 2 - ln2 - 1 = 0.3068528;  -ln 2 -> 0.5 + ln2 - 1 = 0.1931472
    assert kl_k3(logp, ref)[0].tolist() == pytest.approx([0.0, 0.3068528, 0.1931472], abs=1e-6)


def test_k3_is_non_negative_and_its_gradient_vanishes_at_the_reference():
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(4, 5, generator=g).requires_grad_(True)
    ref = torch.randn(4, 5, generator=g)
    assert (kl_k3(logp, ref) >= 0).all()
    at_ref = ref.clone().requires_grad_(True)
    kl_k3(at_ref, ref).sum().backward()
    assert at_ref.grad.abs().max().item() == 0.0


def test_sft_loss_is_masked_negative_log_likelihood():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.125, 0.9, 0.9]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, m = sft_loss(logp, mask)
    # (ln 2 + ln 4 + ln 8) / 3 = 6 ln2 / 3 = 2 ln 2
    assert loss.item() == pytest.approx(2 * math.log(2), abs=1e-6)
    assert m["n_tokens"] == 3 and m["nll"] == pytest.approx(2 * math.log(2), abs=1e-6)
    seq, _ = sft_loss(logp, mask, agg="seq_mean")
    assert seq.item() == pytest.approx(((math.log(2) + math.log(4)) / 2 + math.log(8)) / 2, abs=1e-6)


def test_token_logprobs_matches_log_softmax_gather_in_any_chunking():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 4, 11, generator=g)
    targets = torch.randint(0, 11, (3, 4), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    for chunk in (1, 2, 5):
        assert torch.allclose(token_logprobs(logits, targets, chunk_rows=chunk), ref, atol=1e-6)
    # bf16 logits are upcast; an ignore index (-100) does not crash
    out = token_logprobs(logits.bfloat16(), targets.masked_fill(targets == targets[0, 0], -100))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    # hand value: uniform logits over 4 tokens -> ln(1/4)
    assert token_logprobs(torch.zeros(1, 1, 4), torch.tensor([[2]])).item() == pytest.approx(-math.log(4))


def test_token_logprobs_gradient_flows_to_the_logits():
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    token_logprobs(logits, torch.tensor([[2]])).sum().backward()
    # d log softmax_2 / d z = onehot(2) - softmax = [-0.25, -0.25, 0.75, -0.25]
    assert logits.grad[0, 0].tolist() == pytest.approx([-0.25, -0.25, 0.75, -0.25])


def test_the_update_divides_by_the_count_a_new_aggregation_declares(tiny):
    """optimizer_step asks the aggregation registry for the batch's divisor: a new aggregation (here one whose
    count is neither the tokens nor the rows) gets its own, in every micro-batch."""
    import copy

    from envace.math.algos import Aggregation, rows_normalizer
    from envace.core.types import Row
    from envace.training.update import optimizer_step

    lengths = [3, 1, 4]
    rows = [
        Row("act", [5, 6, 7 + i], list(range(20, 20 + n)), [0.0] * n, "t", f"traj{i}", "g")
        for i, n in enumerate(lengths)
    ]
    squares = Aggregation(total=lambda x, m: (x * m).sum(), count=lambda m: (m.sum(-1) ** 2).sum(), doc="test only")
    AGGREGATIONS.add("test_squared_lengths", squares)
    try:
        assert (
            rows_normalizer(lengths, "test_squared_lengths")
            == rows_normalizer(lengths + [0], "test_squared_lengths")
            == 9 + 1 + 16
        )
        seen = []

        def loss_fn(logp, mask, idxs, normalizer):
            seen.append(normalizer)
            return aggregate(-logp, mask, "test_squared_lengths", normalizer), {"n_tokens": float(mask.sum())}

        model = copy.deepcopy(tiny[0])
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        optimizer_step(
            model,
            opt,
            rows,
            loss_fn,
            agg="test_squared_lengths",
            micro_batch_tokens=4,
            temperatures={},
            max_grad_norm=1e9,
        )
        assert len(seen) >= 2 and set(seen) == {26.0}  # not the 8 tokens, not the 3 non-empty rows
    finally:
        AGGREGATIONS.remove("test_squared_lengths")
    assert "test_squared_lengths" not in AGGREGATIONS
    assert rows_normalizer(lengths + [0], "token_mean") == 8.0 and rows_normalizer(lengths + [0], "seq_mean") == 3.0
    with pytest.raises(UnknownNameError, match="token_mean"):
        rows_normalizer(lengths, "test_squared_lengths")
