"""Every message between the groups survives its tensor encoding (through LocalTransport)."""

import torch

from swiftspec.distributed.protocol import DraftTree, LocalTransport, Profile, Shutdown, Start, Verified
from swiftspec.sampling import SamplingParams


def test_messages_round_trip() -> None:
    a, b = LocalTransport.pair()
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, seed=42)
    sent = [
        Start(prompt=torch.tensor([5, 6, 7]), first_token=9, depth=3, params=params),
        Start(prompt=torch.tensor([5]), first_token=9, depth=3, params=SamplingParams(),
              verify_costs=torch.tensor([0.01, 0.012, 0.02], dtype=torch.float64)),
        Start(prompt=torch.tensor([1]), first_token=2, depth=1, params=SamplingParams()),
        DraftTree(tokens=torch.tensor([9, 4, 8]), parents=torch.tensor([-1, 0, 1]), depths=torch.tensor([0, 1, 2])),
        Verified(tokens=torch.tensor([4, 8, 1]), nodes=torch.tensor([0, 1, 2]), stop=True),
        Profile(seconds=1.5, events=torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)),
        Shutdown(),
    ]
    for msg in sent:
        a.send(msg)
    assert b.ready()
    for msg in sent:
        got = b.recv()
        assert type(got) is type(msg)
        for name in msg.__dataclass_fields__:
            want, have = getattr(msg, name), getattr(got, name)
            assert torch.equal(want, have) if isinstance(want, torch.Tensor) else want == have, name
    assert not b.ready()
