"""Every registered backend inside the LRA classifier: a training step, padding, save/load round trip."""

import pytest
import torch

import attention
from lra.model import LRAClassifier, loss_and_correct


@pytest.mark.parametrize("name", attention.available())
def test_train_step_and_state_dict_round_trip(name):
    torch.manual_seed(0)
    kw = dict(vocab_size=16, seq_len=128, num_classes=10, attn_name=name, attn_options={})
    model = LRAClassifier(**kw)
    tokens = torch.randint(1, 16, (3, 128))
    mask = torch.ones(3, 128, dtype=torch.bool)
    mask[0, 90:] = False  # padding at the end
    mask[1, 30:50] = False  # padding in the middle
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    loss, _ = loss_and_correct(model(tokens, mask), torch.tensor([1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()

    model.eval()
    clone = LRAClassifier(**kw).eval()
    clone.load_state_dict(model.state_dict())  # every learned or fixed-random tensor is saved
    torch.manual_seed(2)
    a = model(tokens, mask)
    torch.manual_seed(2)
    b = clone(tokens, mask)
    torch.testing.assert_close(a, b)
