for r in 1 2 3; do for h in t1 t0; do
  echo "=== $h round $r $(date +%T)"
  /tmp/s39/da-$h bench --backend cpu --batch 1,4 --seq-len 16384,65536
done; done
