"""The step's prefill tokens split in merge order: each placement's grant, the cap and the hold.

Must not import vllm. `FairwayPolicy`'s rule (`fairway.policies.fairway`) places the step's
requests; these functions give out the step's tokens along that order and turn the grants into
the step's plan for vLLM's knobs: one cap per request, the running prefills held back.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence


def grants(
    keys: Sequence[int],
    work: Mapping[int, int],
    tokens: int,
    slots: int,
    done: Mapping[int, int] | None = None,
    free_blocks: int | None = None,
    block_size: int = 16,
    loads: Container[int] = (),
) -> list[int]:
    """Prefill tokens each placement gets when the step's `tokens` are given out in merge order:
    min(its work, what is left), a waiting request (key >= 0) only while `slots` last.

    A waiting request in `loads` (a hit in the CPU offload tier) gets nothing and takes no slot:
    vLLM starts its copy and computes nothing for it in this step (it waits outside the running
    set for the copy), so the tokens go on to the next placements; its blocks are counted.

    With `free_blocks` (and `done`: the tokens each request already holds, cached or computed)
    the KV stop is foreseen as vLLM makes it: the first waiting request whose blocks do not fit
    (all of them counted, the cached ones too, since evictable cached blocks are in the free
    count) gets nothing, nor does any waiting request after it; running prefills keep getting
    tokens (their new blocks only). So a plan never holds a running prefill back for a waiting
    request that cannot start: that step would have nothing to schedule, and the next the same."""
    out: list[int] = []
    left = tokens
    blocks = free_blocks
    stopped = False
    for key in keys:
        if key >= 0 and key in loads and not stopped:
            out.append(0)
            if blocks is not None and done is not None:
                need = -(-done[key] // block_size)
                if need > blocks:
                    stopped = True
                else:
                    blocks -= need
            continue
        if left <= 0 or (key >= 0 and (slots <= 0 or stopped)):
            out.append(0)
            continue
        given = min(work[key], left)
        if blocks is not None and done is not None:
            held = done[key]
            need = -(-(held + given) // block_size) - (-(-held // block_size) if key < 0 else 0)
            if key >= 0 and need > blocks:
                stopped = True
                out.append(0)
                continue
            blocks -= min(need, blocks)
        if key >= 0:
            slots -= 1
        out.append(given)
        left -= given
    return out


def cap_and_hold(
    keys: Sequence[int],
    given: Sequence[int],
    work: Mapping[int, int],
    running_ids: Sequence[str],
    ids: Mapping[int, str],
    front: int,
    front_held: str | None,
    tokens: int,
) -> tuple[int, set[str]]:
    """The step's per-request cap and the running prefills held back, from the grants `given`
    in merge order (`keys`; running prefill j is key -(j + 1), its id `running_ids[j]`).

    A running prefill given nothing is held. The one the tokens run out on is capped at its
    grant, unless that cap would chunk a request placed before it: then it is held instead,
    except the Fair `front` when it was held at the last step (`front_held`): a front is not
    held two steps in a row, its cap is then at least what came before it."""
    got = dict(zip(keys, given, strict=True))
    hold = {rid for j, rid in enumerate(running_ids) if got.get(-(j + 1), 0) == 0}
    cap = tokens
    for i, (key, grant) in enumerate(zip(keys, given, strict=True)):
        if key < 0 and 0 < grant < work[key]:  # the running prefill the budget runs out on
            before = [work[k] for k, b in zip(keys[:i], given[:i], strict=True) if b > 0]
            if all(amount <= grant for amount in before):
                cap = grant
            elif key == front and ids[key] == front_held:
                cap = max(before)
            else:
                hold.add(ids[key])
            break
    return cap, hold
