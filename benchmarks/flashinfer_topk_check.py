"""On the GPU machine, after benchmarks/stage_flashinfer_jit.sh's setup: FlashInfer's
`top_k_page_table_transform` (the DSA indexer's top-k as the contest baseline calls it) against
torch.topk on rows of different lengths. The first call builds FlashInfer's "topk" module when no
prebuilt one is installed; the time printed includes that build."""
import time

import torch
import flashinfer

t0 = time.time()
torch.manual_seed(0)
rows, pages, page, k = 3, 80, 64, 2048
lengths = torch.tensor([pages * page, 3000, 2048], dtype=torch.int32, device="cuda")
logits = torch.randn(rows, pages * page, device="cuda")
table = torch.stack([torch.randperm(1000, device="cuda")[:pages] for _ in range(rows)]).to(torch.int32)
out = flashinfer.top_k_page_table_transform(logits, table, lengths, k, page_size=page)
torch.cuda.synchronize()
took = time.time() - t0
ok = True
for r in range(rows):
    n = int(lengths[r])
    idx = torch.topk(logits[r, :n], k).indices
    want = (table[r, idx // page].long() * page + idx % page).sort().values
    got = out[r][out[r] >= 0].long().sort().values
    ok &= torch.equal(got, want)
print(f"flashinfer top-k: first call in {took:.0f} s; matches torch.topk: {ok}")
if not ok:
    raise SystemExit(1)
