"""prepare-data at two corpus sizes: peak memory (flat in the corpus size?) and tokens/s per process, beside the
core loop of llm.c's ``dev/data/fineweb.py`` on the same documents and tokenizer.

    python benchmarks/prepare_data_scale.py --work /tmp/prep_bench --sizes_mb 20 100 --processes 2

The corpus is real text that ships here: the Python standard library's sources and the embedded tinyshakespeare
(in paragraphs), one JSONL document each, repeated until the size is reached. A byte-level BPE (8,192 tokens) is
trained on its first 5 MB. Each preparation runs as its own process under a sampler (every 0.2 s) that records the
peak RSS of the main process and the peak summed PSS of its process tree (PSS splits the pages forked workers
share, so the sum is what the tree really holds).

llm.c's loop, as in its fineweb.py (commit f1e2ace): ``Pool.imap(tokenize, docs, chunksize=16)``, one document per
call, ``[EOT] + encode(text)`` as a numpy array, copied into a preallocated shard buffer. tiktoken's ``gpt2``
cannot be fetched here, so its ``encode_ordinary`` is replaced by the same ``tokenizers`` file; the input is the
same JSONL (llm.c reads an HF ``datasets`` table).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

LLMC_LOOP = r'''
import json, multiprocessing as mp, sys, time, numpy as np
from tokenizers import Tokenizer
tok_path, corpus, out, shard_size, nprocs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
enc = Tokenizer.from_file(tok_path)
eot = enc.token_to_id("<|endoftext|>")
def tokenize(doc):
    tokens = [eot]
    tokens.extend(enc.encode(doc["text"], add_special_tokens=False).ids)
    return np.array(tokens).astype(np.uint16)
def docs():
    with open(corpus) as f:
        for line in f:
            yield json.loads(line)
if __name__ == "__main__":
    total, shard_index, token_count = 0, 0, 0
    start = time.perf_counter()
    with mp.Pool(nprocs) as pool:
        buf = np.empty((shard_size,), dtype=np.uint16)
        for tokens in pool.imap(tokenize, docs(), chunksize=16):
            total += len(tokens)
            if token_count + len(tokens) < shard_size:
                buf[token_count:token_count + len(tokens)] = tokens
                token_count += len(tokens)
            else:
                remainder = shard_size - token_count
                buf[token_count:] = tokens[:remainder]
                buf.tofile(f"{out}_{shard_index:06d}.bin")
                shard_index += 1
                buf[:len(tokens) - remainder] = tokens[remainder:]
                token_count = len(tokens) - remainder
        buf[:token_count].tofile(f"{out}_{shard_index:06d}.bin")
    print(json.dumps({"tokens": total, "seconds": time.perf_counter() - start}))
'''


def build_corpus(path: Path, size_mb: float) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p for p in sorted(stdlib.rglob("*.py")) if "site-packages" not in p.parts]
    shakespeare = (REPO / "lit" / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8").split("\n\n")
    docs = shakespeare + [p.read_text(encoding="utf-8", errors="replace") for p in sources]
    target, written = int(size_mb * 1e6), 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            for doc in docs:
                line = json.dumps({"text": doc}) + "\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                if written >= target:
                    break


def measured(command: list[str]) -> dict:
    """Run ``command``; its wall time, output, and peak memory (main RSS, tree PSS) sampled every 0.2 s."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    main = psutil.Process(process.pid)
    peak_rss = peak_tree = 0
    while process.poll() is None:
        try:
            tree = [main] + main.children(recursive=True)
            peak_rss = max(peak_rss, main.memory_info().rss)
            peak_tree = max(peak_tree, sum(p.memory_full_info().pss for p in tree))
        except psutil.Error:
            pass
        time.sleep(0.2)
    out, err = process.communicate()
    if process.returncode:
        raise SystemExit(f"{command} failed:\n{err}")
    return {"wall_s": time.perf_counter() - start, "stdout": out, "stderr": err,
            "peak_main_rss_mb": peak_rss / 2**20, "peak_tree_pss_mb": peak_tree / 2**20}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/prep_bench")
    p.add_argument("--sizes_mb", type=float, nargs="+", default=[20, 100])
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--llmc_mb", type=float, default=20, help="corpus size for the llm.c loop (0: skip)")
    p.add_argument("--rounds", type=int, default=1, help="llm.c loop runs, each but the last followed by a "
                   "prepare-data run on the same corpus (start with --sizes_mb at --llmc_mb to interleave)")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    corpora = {}
    for size in sorted(set(a.sizes_mb) | ({a.llmc_mb} if a.llmc_mb else set())):
        corpora[size] = work / f"corpus_{size:g}mb.jsonl"
        if not corpora[size].exists():
            build_corpus(corpora[size], size)
    tokenizer = work / "tokenizer.json"
    if not tokenizer.exists():
        subprocess.run([sys.executable, "cli.py", "train-tokenizer", "--vocab_size", "8192", "--max_bytes", "5000000",
                        "--out", str(tokenizer), str(corpora[min(corpora)])], cwd=REPO, check=True)

    def prepared(size: float, what: str) -> dict:
        out = work / f"shards_{size:g}mb_p{a.processes}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        r = measured([sys.executable, "-m", "lit.data.prepare", "--tokenizer", str(tokenizer), "--out", str(out),
                      "--processes", str(a.processes), "--shard_tokens", "10000000", str(corpora[size])])
        meta = json.loads((out / "meta.json").read_text())
        tokens = sum(meta[f"{s}_tokens"] for s in ("train", "val", "test"))
        done = [line for line in r["stderr"].splitlines() if " tokens in " in line][-1]
        seconds = float(done.split(" tokens in ")[1].split(" s ")[0].replace(",", ""))
        return {"what": what, "corpus_mb": size, "tokens": tokens, "seconds": seconds, **r}

    rows = [prepared(size, "prepare-data") for size in a.sizes_mb]
    for round_ in range(a.rounds if a.llmc_mb else 0):  # interleaved: the machine's load moves both alike
        out = work / "llmc"
        out.mkdir(exist_ok=True)
        r = measured([sys.executable, "-c", LLMC_LOOP, str(tokenizer), str(corpora[a.llmc_mb]), str(out / "fineweb"),
                      "10000000", str(a.processes)])
        rows.append({"what": f"llm.c fineweb.py loop #{round_ + 1}", "corpus_mb": a.llmc_mb,
                     **json.loads(r["stdout"]), **r})
        if round_ + 1 < a.rounds:
            rows.append(prepared(a.llmc_mb, f"prepare-data #{round_ + 2}"))
    # tokens/s over the encoding loop (each program's own clock), not the start-up; wall time beside it.
    print(f"{'what':<24}{'corpus MB':>10}{'tokens':>12}{'wall s':>9}{'tok/s':>10}{'tok/s/proc':>11}"
          f"{'main RSS MB':>12}{'tree PSS MB':>12}")
    for row in rows:
        rate = row["tokens"] / row["seconds"]
        print(f"{row['what']:<24}{row['corpus_mb']:>10g}{row['tokens']:>12,}{row['wall_s']:>9.1f}{rate:>10,.0f}"
              f"{rate / a.processes:>11,.0f}{row['peak_main_rss_mb']:>12.0f}{row['peak_tree_pss_mb']:>12.0f}")


if __name__ == "__main__":
    main()
