// What every page gets (the live feed, whether this browser is the operator)
// and gives back (a way to stop listening when the user leaves it).
import type { Feed } from '../feed.ts';

export interface PageContext {
  feed: Feed;
  operator: boolean;
  /** shows an action's outcome (or error) in the page's message line; '' clears it */
  notify(message: string, error?: boolean): void;
}

export interface Page {
  dispose(): void;
}

/** A page drawn whole from the feed's store, again after every section it reads arrives. */
export function livePage(ctx: PageContext, reads: readonly string[], draw: () => void): Page {
  draw();
  const off = ctx.feed.listen((changed) => {
    if (reads.includes(changed)) draw();
  });
  return { dispose: off };
}
