// The server-sent events reader (src/api/event-stream.ts) that the CLI and the
// dashboard's playground share: events cut anywhere across chunks (a UTF-8
// character too) come out whole and in order, comments are skipped, and a
// consumer that stops early cancels the body.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { readEvents } from '../../src/api/event-stream.ts';

function response(chunks: Uint8Array[], onCancel: () => void = () => {}): Response {
  let i = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (i < chunks.length) controller.enqueue(chunks[i++]);
      else controller.close();
    },
    cancel: onCancel,
  });
  return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
}

test('events cut anywhere across chunks come out whole and in order; comments are skipped', async () => {
  const text = ': a comment\n\ndata: {"text":"Ishmaël"}\n\nevent: progress\nid: 7\ndata: line one\ndata: line two\n\ndata: [DONE]\n\n';
  const bytes = new TextEncoder().encode(text);
  for (const size of [1, 2, 3, 5, 17, bytes.length]) {
    const chunks: Uint8Array[] = [];
    for (let at = 0; at < bytes.length; at += size) chunks.push(bytes.subarray(at, at + size));
    const got = [];
    for await (const e of readEvents(response(chunks))) got.push(e);
    assert.deepEqual(got, [
      { event: 'message', data: '{"text":"Ishmaël"}', id: null },
      { event: 'progress', data: 'line one\nline two', id: '7' },
      { event: 'message', data: '[DONE]', id: null },
    ], `chunks of ${size}`);
  }
});

test('a consumer that stops early cancels the body', async () => {
  let cancelled = false;
  const res = response([new TextEncoder().encode('data: 1\n\ndata: 2\n\n'), new TextEncoder().encode('data: 3\n\n')], () => void (cancelled = true));
  for await (const e of readEvents(res)) {
    assert.equal(e.data, '1');
    break;
  }
  assert.ok(cancelled);
});
