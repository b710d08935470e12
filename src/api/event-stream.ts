// A reader of server-sent events (text/event-stream) from a fetch response:
// yields each event's name and data as it arrives.

export interface ServerEvent {
  event: string;
  data: string;
  id: string | null;
}

/**
 * Events of `res`'s body in order; ends when the stream does (a consumer that
 * stops early cancels the body). Read with getReader, which browsers and Node
 * both have: the dashboard's playground uses it too.
 */
export async function* readEvents(res: Response): AsyncGenerator<ServerEvent> {
  if (!res.body) return;
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let ended = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        return;
      }
      buffer += decoder.decode(value, { stream: true });
      let cut: number;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const e = parseBlock(block);
        if (e) yield e;
      }
    }
  } finally {
    if (!ended) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/** One event block (comments and empty blocks give null). */
export function parseBlock(block: string): ServerEvent | null {
  let event = 'message';
  let id: string | null = null;
  const data: string[] = [];
  for (const line of block.split('\n')) {
    if (line === '' || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
    if (field === 'event') event = value;
    else if (field === 'data') data.push(value);
    else if (field === 'id') id = value;
  }
  return data.length ? { event, data: data.join('\n'), id } : null;
}
