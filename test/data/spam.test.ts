// The SpamAssassin data set: labels, the held-out split, the features (finite,
// unit norm, blind to every header but Subject) and batches by (seed, shard).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import {
  buildSpamDataset, isSpamHeldout, loadSpamDataset, loadSpamDatasetAsync, spamBatch, spamDatasetIfBuilt, spamFeatures, spamLabel, spamMessageKey, spamMessages,
  spamSubjectAndBody, SPAM_FEATURES, SPAM_HELDOUT_FRACTION, SPAM_MAX_FEATURES, type SpamMessage,
} from '../../src/data/spam.ts';

const ham = `From someone@example.org  Thu Aug 22 12:36:23 2002
Return-Path: <list-admin@lists.example.org>
Received: from localhost (localhost [127.0.0.1])
\tby phobos.labs.example.org (Postfix) with ESMTP id D03E543C36
From: Someone <someone@example.org>
Subject: Re: the build is broken
 again on arm64
X-Mailing-List: dev@lists.example.org

I pushed a fix for the linker flags; please pull and try again.
`;

const norm = (row: Float32Array): number => Math.sqrt(row.reduce((s, v) => s + v * v, 0));
/** A digest of row r of a feature matrix. */
const rowKey = (x: Float32Array, r: number): string => createHash('sha256').update(new Uint8Array(x.buffer, x.byteOffset + r * SPAM_FEATURES * 4, SPAM_FEATURES * 4)).digest('hex');

test('labels: 6,046 messages, spam-* groups are spam, the rest ham', () => {
  const messages = spamMessages();
  assert.equal(messages.length, 6046);
  const spam = messages.filter((m) => spamLabel(m.group) === 1);
  assert.equal(spam.length, 1896);
  assert.ok(spam.every((m) => m.group.startsWith('spam')));
  assert.deepEqual([...new Set(messages.filter((m) => spamLabel(m.group) === 0).map((m) => m.group))].sort(), ['easy-ham-1', 'easy-ham-2', 'hard-ham-1']);
  assert.equal(new Set(messages.map(spamMessageKey)).size, messages.length, 'group/id names every message once');
});

test('the split is a fixed function of the message name, about 20% held out', () => {
  const keys = spamMessages().map(spamMessageKey);
  const held = keys.filter(isSpamHeldout);
  assert.deepEqual(keys.filter(isSpamHeldout), held);
  const fraction = held.length / keys.length;
  assert.ok(Math.abs(fraction - SPAM_HELDOUT_FRACTION) < 0.02, `${fraction}`);
  // pinned: changing the hash would silently move messages between the splits
  assert.deepEqual(['easy-ham-1/00001', 'spam-2/00007', 'spam-1/00003'].map(isSpamHeldout), [false, false, true]);
});

test('the data set: disjoint splits, finite unit-norm rows, no held-out copy of a training row', () => {
  const d = loadSpamDataset();
  assert.equal(loadSpamDataset(), d, 'built once per process');
  assert.equal(d.features, SPAM_FEATURES);
  assert.equal(d.train.rows + d.heldout.rows + d.droppedDuplicates, 6046);
  assert.ok(d.droppedDuplicates < 100, `${d.droppedDuplicates} duplicates dropped`);
  for (const s of [d.train, d.heldout]) {
    assert.equal(s.x.length, s.rows * SPAM_FEATURES);
    assert.equal(s.y.length, s.rows);
    assert.ok(s.y.every((c) => c === 0 || c === 1));
    const spam = s.y.reduce((n, c) => n + c, 0) / s.rows;
    assert.ok(spam > 0.25 && spam < 0.4, `spam fraction ${spam}`);
    for (let r = 0; r < s.rows; r++) {
      let sq = 0, bad = 0;
      for (let i = r * SPAM_FEATURES; i < (r + 1) * SPAM_FEATURES; i++) {
        const v = s.x[i];
        if (!(Number.isFinite(v) && v >= 0)) bad++;
        sq += v * v;
      }
      assert.equal(bad, 0, `row ${r} has negative or non-finite values`);
      assert.ok(Math.abs(Math.sqrt(sq) - 1) < 1e-4, `row ${r} norm ${Math.sqrt(sq)}`);
    }
  }
  const train = new Set(Array.from({ length: d.train.rows }, (_, r) => rowKey(d.train.x, r)));
  for (let r = 0; r < d.heldout.rows; r++) assert.ok(!train.has(rowKey(d.heldout.x, r)), `held-out row ${r} is in train`);
});

test('a held-out message repeating a training message is dropped; the split sides come from the names', () => {
  const names = Array.from({ length: 200 }, (_, i) => String(i).padStart(5, '0'));
  const trainName = names.find((id) => !isSpamHeldout(`spam-1/${id}`))!;
  const heldName = names.find((id) => isSpamHeldout(`easy-ham-1/${id}`))!;
  const messages: SpamMessage[] = [
    { id: trainName, group: 'spam-1', text: 'Subject: win\n\ncheap pills' },
    { id: heldName, group: 'easy-ham-1', text: 'Received: elsewhere\nSubject: win\n\ncheap pills' },
    { id: heldName, group: 'spam-2', text: 'Subject: hello\n\nsomething else' },
  ];
  const d = buildSpamDataset(messages, 64);
  assert.equal(d.features, 64);
  assert.equal(d.train.rows + d.heldout.rows + d.droppedDuplicates, 3);
  assert.equal(d.droppedDuplicates, 1);
  assert.ok(d.train.rows >= 1);
});

test('features read the Subject and the body only, never the other headers', () => {
  const base = spamFeatures(ham);
  assert.equal(base.length, SPAM_FEATURES);
  assert.ok(Math.abs(norm(base) - 1) < 1e-5);
  // other headers rewritten, added, removed; CRLF line ends
  const variants = [
    ham.replace('Return-Path: <list-admin@lists.example.org>', 'Return-Path: <zzzz@spamassassin.taint.org>'),
    ham.replace(/^Received:.*\n\t.*\n/m, ''),
    ham.replace('X-Mailing-List: dev@lists.example.org', 'X-Spam-Status: Yes, hits=12.3\nX-Mailer: Microsoft Outlook Express'),
    ham.replace('From someone@example.org  Thu Aug 22 12:36:23 2002', 'From 12a1mailbot1@web.de  Sat Aug 24 09:42:10 2002'),
    ham.replace(/\n/g, '\r\n'),
  ];
  for (const v of variants) assert.deepEqual(spamFeatures(v), base);
  assert.deepEqual(spamSubjectAndBody(ham), { subject: 'Re: the build is broken again on arm64', body: 'I pushed a fix for the linker flags; please pull and try again.\n' });
  // …and both of those count
  assert.notDeepEqual(spamFeatures(ham.replace('again on arm64', 'again on x86')), base);
  assert.notDeepEqual(spamFeatures(ham.replace('linker flags', 'FREE VIAGRA')), base);
  // a Subject n-gram is not the same feature as that n-gram in the body
  assert.notDeepEqual(spamFeatures('Subject: cheap\n\n'), spamFeatures('Subject: \n\ncheap'));
  // case does not matter; an empty message is all zeros
  assert.deepEqual(spamFeatures(ham.replace('I pushed', 'I PUSHED')), base);
  assert.ok(spamFeatures('X-Other: header\n\n').every((v) => v === 0));
});

test('a batch is a function of (seed, shard), drawn from the training split', () => {
  const d = loadSpamDataset();
  const a = spamBatch(d, 1, 7, 16);
  assert.deepEqual(spamBatch(d, 1, 7, 16), a);
  assert.equal(a.B, 16);
  assert.equal(a.x.length, 16 * SPAM_FEATURES);
  assert.notDeepEqual(spamBatch(d, 1, 8, 16).x, a.x);
  assert.notDeepEqual(spamBatch(d, 2, 7, 16).x, a.x);
  // every row is a training row with its label
  const rows = new Map<string, number>();
  for (let r = 0; r < d.train.rows; r++) rows.set(rowKey(d.train.x, r), d.train.y[r]);
  for (let b = 0; b < a.B; b++) assert.equal(rows.get(rowKey(a.x, b)), a.y[b]);
  assert.throws(() => spamBatch(d, 1, -1, 16), /non-negative/);
  assert.throws(() => spamBatch(d, 1, 0, 0), /positive/);
});

test('built in slices (loadSpamDatasetAsync), the data set is the one built at once; concurrent calls share one build, then it is kept', async () => {
  const features = 128;
  assert.equal(spamDatasetIfBuilt(features), null);
  const [a, b] = await Promise.all([loadSpamDatasetAsync(features), loadSpamDatasetAsync(features)]);
  assert.equal(a, b, 'one build');
  assert.equal(spamDatasetIfBuilt(features), a);
  assert.equal(loadSpamDataset(features), a, 'the sync loader finds it built');
  const once = buildSpamDataset(spamMessages(), features);
  assert.deepEqual(a.train.x, once.train.x);
  assert.deepEqual(a.heldout.y, once.heldout.y);
  assert.equal(a.droppedDuplicates, once.droppedDuplicates);
  await assert.rejects(loadSpamDatasetAsync(SPAM_MAX_FEATURES + 1), /features must be an integer from 1 to 16384/);
});
