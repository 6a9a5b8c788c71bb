#!/bin/sh
# Every C code block in README.md is quoted from a file that make test
# builds and runs: the line before its fence names the file
# (<!-- example: examples/x.c -->), and the block's lines, leading blanks
# aside, stand in that file one after another. So the README cannot show
# code that does not compile or run.
cd "$(dirname "$0")/.." || exit 1
awk '
function strip(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
function check(   i, j, k, n, ok, line, src) {
    if (file == "") { printf("README.md:%d: a ```c block without <!-- example: FILE --> before it\n", start); bad++; return }
    n = 0
    while ((getline line < file) > 0) src[++n] = strip(line)
    close(file)
    if (n == 0) { printf("README.md:%d: %s is missing or empty\n", start, file); bad++; return }
    for (i = 1; i + nb - 1 <= n; i++) {
        ok = 1
        for (k = 1; k <= nb && ok; k++) if (src[i + k - 1] != blk[k]) ok = 0
        if (ok) { found++; return }
    }
    printf("README.md:%d: this block is not in %s as it stands (first line: %s)\n", start, file, blk[1]); bad++
}
/^<!-- example: .* -->$/ { pending = $3; next }
/^```c$/ { inblk = 1; nb = 0; start = NR; file = pending; pending = ""; next }
/^```/ && inblk { inblk = 0; check(); next }
inblk { blk[++nb] = strip($0); next }
{ pending = "" }
END {
    blocks = found + bad
    printf("README code blocks: %d quoted from their examples, %d not\n", found, bad)
    printf("RESULT %d %d 0\n", found, bad)
    exit bad ? 1 : (blocks ? 0 : 1)
}' README.md || exit 1
# ...and the build lines under <!-- run: ... --> work as written (the
# output renamed into build/, the toolkit at $CUDA_HOME): each builds, and
# the program runs with --quick
n=0
awk '/^<!-- run: / { want = 1; next } /^```sh$/ && want { inblk = 1; want = 0; next }
     /^```/ && inblk { inblk = 0; next } inblk { print } { if (!/^<!-- run: /) want = want && /^$/ }' README.md |
    sed -e ':a' -e '/\\$/N; s/\\\n//; ta' -e 's/ *#.*$//' > build/readme_run.sh
while IFS= read -r line; do
    [ -n "$line" ] || continue
    n=$((n + 1))
    # the plain-C CUDA line also against the simulated runtime, which has a
    # GPU: the loop must take the CUDA path and not read device memory on
    # the CPU (the real toolkit here has no GPU, so it falls back)
    case "$line" in gcc*-DPREFETCH_CUDA*)
        sim=$(echo "$line" | sed -e "s| -o quickstart| -o build/readme_build_${n}_sim|" \
              -e "s|-I/usr/local/cuda/include|-DTEST_SIM -Itests/sim|" -e "s|-L/usr/local/cuda/lib64 -lcudart|-x none tests/sim/cuda_sim.c|")
        if ! sh -c "$sim" > build/readme_build_${n}_sim.log 2>&1 ||
           ! REQUIRE_GPU=1 build/readme_build_${n}_sim --quick > build/readme_build_${n}_sim.run 2>&1; then
            echo "README.md build line $n on the simulated GPU fails: $sim (see build/readme_build_${n}_sim.log, .run)"
            echo "RESULT 0 1 0"; exit 1
        fi
        echo "  ok (simulated GPU): $sim" ;;
    esac
    case "$line" in *nvcc*|*cudart*) [ "$HAVE_CUDA" = 1 ] || { echo "  skip (no CUDA toolkit): $line"; continue; } ;; esac
    cmd=$(echo "$line" | sed -e "s| -o quickstart| -o build/readme_build_$n|" -e "s|/usr/local/cuda|${CUDA_HOME:-/usr/local/cuda}|g")
    case "$line" in nvcc*) cmd="${NVCC:-nvcc}${cmd#nvcc}" ;; esac
    if ! sh -c "$cmd" > build/readme_build_$n.log 2>&1 || ! build/readme_build_$n --quick > build/readme_build_$n.run 2>&1; then
        echo "README.md build line $n fails: $line (see build/readme_build_$n.log, .run)"; echo "RESULT 0 1 0"; exit 1
    fi
    echo "  ok: $line"
done < build/readme_run.sh
[ $n -gt 0 ] || { echo "README.md: no <!-- run: --> block found"; echo "RESULT 0 1 0"; exit 1; }

# ...and each file quoted is one that make test builds
for f in $(sed -n 's/^<!-- example: \(.*\) -->$/\1/p' README.md | sort -u); do
    grep -q "$f" Makefile || { echo "README.md quotes $f, which make test does not build"; echo "RESULT 0 1 0"; exit 1; }
done
