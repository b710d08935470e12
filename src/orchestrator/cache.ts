// The orchestrator's small caches (spot checks' recomputation stages, run
// data, checkpoint evaluation's models): maps that keep their newest few
// entries.

/** Sets `key` in `map` and keeps at most `limit` entries, dropping the oldest (`drop` releases what an entry holds). */
export function remember<T>(map: Map<string, T>, key: string, value: T, limit: number, drop?: (old: T) => void): void {
  map.set(key, value);
  while (map.size > limit) {
    const [oldKey, old] = map.entries().next().value!;
    map.delete(oldKey);
    drop?.(old);
  }
}
