"""torch_peer.py - the peer column of `make bench`: the same workloads as
bench/peer_bench.c, through torch.utils.data.DataLoader.

Run by peer_bench with the workload on the command line; prints one JSON
line per measurement. Same rules as the C side: items in RAM, each item's
first 8 bytes hold its index and every batch is checked; one untimed
warm-up epoch, then the timed epochs; persistent workers.

  python3 bench/torch_peer.py copy ITEM_BYTES ITEMS BATCH WORKERS PREFETCH EPOCHS
  python3 bench/torch_peer.py overlap ITEMS BATCH WORKERS PREFETCH ITEM_US STEP_US
"""
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    """N items of B bytes in one array; item i starts with i."""

    def __init__(self, n, item_bytes, item_us=0.0):
        self.data = np.full((n, item_bytes), 0xA5, dtype=np.uint8)  # resident, as the C side's
        self.data[:, :8] = np.arange(n, dtype=np.int64).view(np.uint8).reshape(n, 8)
        self.item_us = item_us

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        if self.item_us:
            time.sleep(self.item_us / 1e6)
        return torch.from_numpy(self.data[i])  # collate stacks them: one copy, as our load does


def pss_kib(pid):
    """Proportional set size: pages shared with the parent after fork count in part."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def workers_pss_kib():
    total = 0
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    total += pss_kib(pid)
        except (OSError, ValueError, IndexError):
            pass
    return total


def loader(ds, batch, workers, prefetch):
    return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, prefetch_factor=prefetch,
                      persistent_workers=True, pin_memory=False, drop_last=False)


def run_epoch(dl, step_us=0.0):
    n = 0
    for b in dl:
        idx = b[:, :8].contiguous().view(torch.int64).flatten()
        assert len(set(idx.tolist())) == len(idx), "a batch repeats an item"
        n += len(idx)
        if step_us:
            time.sleep(step_us / 1e6)
    return n


def main():
    kind = sys.argv[1]
    torch.set_num_threads(1)
    if kind == "copy":
        item, items, batch, workers, prefetch, epochs = (int(x) for x in sys.argv[2:8])
        ds = Items(items, item)
        dl = loader(ds, batch, workers, prefetch)
        assert run_epoch(dl) == items  # warm-up: workers started, pages touched
        t0 = time.perf_counter()
        for _ in range(epochs):
            assert run_epoch(dl) == items
        dt = time.perf_counter() - t0
        print(json.dumps({"peer": "torch", "bench": "copy", "item_bytes": item, "batch": batch, "workers": workers,
                          "prefetch_factor": prefetch, "items_per_s": items * epochs / dt,
                          "peak_rss_main_MiB": peak_rss_kib() / 1024, "workers_pss_MiB": workers_pss_kib() / 1024,
                          "torch": torch.__version__}))
    elif kind == "overlap":
        items, batch, workers, prefetch = (int(x) for x in sys.argv[2:6])
        item_us, step_us = float(sys.argv[6]), float(sys.argv[7])
        ds = Items(items, 4096, item_us)
        dl = loader(ds, batch, workers, prefetch)
        run_epoch(dl)
        t0 = time.perf_counter()
        run_epoch(dl, step_us)
        dt = time.perf_counter() - t0
        print(json.dumps({"peer": "torch", "bench": "overlap", "workers": workers, "prefetch_factor": prefetch,
                          "seconds": dt}))
    del dl  # persistent workers end with the loader


if __name__ == "__main__":
    main()
