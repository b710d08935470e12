// Log-probabilities of a sampled token and of the most likely ones, from one
// row of the last stage's logits: the raw logits' log-softmax (before the
// request's temperature and top_p, as vLLM reports them by default).

export interface TokenLogprob {
  /** the sampled token and its log-probability */
  id: number;
  logprob: number;
  /** the `k` most likely tokens, most likely first (lower id first on ties) */
  top: { id: number; logprob: number }[];
}

/** The sampled `token`'s log-probability and the top `k` of `logits` (k ≥ 0). */
export function tokenLogprob(logits: ArrayLike<number>, token: number, k: number): TokenLogprob {
  const V = logits.length;
  let max = -Infinity;
  for (let v = 0; v < V; v++) if (logits[v] > max) max = logits[v];
  let sum = 0;
  for (let v = 0; v < V; v++) sum += Math.exp(logits[v] - max);
  const norm = max + Math.log(sum);
  const lp = (v: number): number => Math.max(logits[v] - norm, -9999);
  // the top k by one pass of insertion into a short sorted list
  const top: number[] = [];
  for (let v = 0; v < V && k > 0; v++) {
    if (top.length === k && logits[v] <= logits[top[k - 1]]) continue;
    let i = top.length;
    while (i > 0 && logits[top[i - 1]] < logits[v]) i--;
    top.splice(i, 0, v);
    if (top.length > k) top.pop();
  }
  return { id: token, logprob: lp(token), top: top.map((id) => ({ id, logprob: lp(id) })) };
}
