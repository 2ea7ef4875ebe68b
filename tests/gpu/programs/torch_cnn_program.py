"""Stock PyTorch: a small CNN trained for 20 steps on fixed random data (same seed, deterministic algorithms),
printing the losses; run natively and forwarded, they must agree (tests/gpu/test_native_frameworks.py)."""
import json

import torch
from torch import nn

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
images = torch.randn(64, 1, 28, 28).cuda()
labels = torch.randint(0, 10, (64,)).cuda()
losses = []
for _step in range(20):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    losses.append(float(loss))
print("RESULT " + json.dumps({"losses": losses, "learned": losses[-1] < losses[0]}))
