// URL parts are numbers only when written in plain decimal
// (src/http/validator.ts): TypeBox's lenient conversion read "1e30" as the
// integer 1, so `/items/1e30` reached the handler as item 1.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Type } from '@sinclair/typebox';
import { createHttpServer, type HttpServer } from '../../src/http/server.ts';

let app: HttpServer;

before(async () => {
  app = createHttpServer({ bodyLimit: 1024 });
  app.get(
    '/items/:id',
    { schema: { params: Type.Object({ id: Type.Integer({ minimum: 0, maximum: 1023 }) }), querystring: Type.Object({ scale: Type.Optional(Type.Number({ maximum: 10 })) }) } },
    async (req) => ({ id: req.params.id, scale: req.query.scale ?? null }),
  );
  app.post('/body', { schema: { body: Type.Object({ n: Type.Integer() }) } }, async (req) => ({ n: req.body.n }));
});
after(async () => {
  await app.close();
});

async function get(url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await app.inject({ method: 'GET', url });
  return { status: res.statusCode, body: JSON.parse(res.body) as Record<string, unknown> };
}

test('params and querystrings in plain decimal are numbers; exponents, fractions of integers, leading zeros, signs and spaces are 400s', async () => {
  assert.deepEqual((await get('/items/12')).body, { id: 12, scale: null });
  assert.deepEqual((await get('/items/0?scale=0.5')).body, { id: 0, scale: 0.5 });
  assert.deepEqual((await get('/items/3?scale=-2')).body, { id: 3, scale: -2 });
  for (const url of ['/items/1e30', '/items/1.9', '/items/012', '/items/+1', '/items/%201', '/items/0x10', '/items/1024', '/items/9007199254740993', '/items/1?scale=1e30', '/items/1?scale=Infinity']) {
    const a = await get(url);
    assert.equal(a.status, 400, `${url}: ${JSON.stringify(a.body)}`);
    assert.equal(a.body.code, 'invalid');
    assert.match(String(a.body.error), /invalid (params|querystring): \/(id|scale)/);
  }
});

test('bodies are not converted: a number as a string is a 400', async () => {
  const res = await app.inject({ method: 'POST', url: '/body', headers: { 'content-type': 'application/json' }, payload: JSON.stringify({ n: '5' }) });
  assert.equal(res.statusCode, 400);
  const ok = await app.inject({ method: 'POST', url: '/body', headers: { 'content-type': 'application/json' }, payload: JSON.stringify({ n: 5 }) });
  assert.deepEqual(JSON.parse(ok.body), { n: 5 });
});
