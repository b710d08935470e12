// The indices 0..n−1 not yet taken, found from any point in either direction
// in near-constant time: two skip lists whose links jump past taken indices
// (path-compressed as they are followed). The assigner's target search
// (assign.ts coverTarget) scans miners with it instead of from the start.

export class Untaken {
  /** down[i + 1] ↔ index i; down[0] = none */
  private readonly down: Int32Array;
  /** up[i] ↔ index i; up[n] = none */
  private readonly up: Int32Array;

  constructor(readonly n: number) {
    this.down = new Int32Array(n + 1);
    this.up = new Int32Array(n + 1);
    for (let i = 0; i <= n; i++) {
      this.down[i] = i;
      this.up[i] = i;
    }
  }

  /** The largest untaken index ≤ i, or −1. */
  atOrBelow(i: number): number {
    return root(this.down, i + 1) - 1;
  }

  /** The smallest untaken index ≥ i, or n. */
  atOrAbove(i: number): number {
    return root(this.up, i);
  }

  take(i: number): void {
    this.down[i + 1] = i;
    this.up[i] = i + 1;
  }
}

/** Follows links from k to a slot that links to itself, pointing every slot passed at it. */
function root(links: Int32Array, k: number): number {
  let r = k;
  while (links[r] !== r) r = links[r];
  while (links[k] !== r) {
    const next = links[k];
    links[k] = r;
    k = next;
  }
  return r;
}
