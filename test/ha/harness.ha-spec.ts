/**
 * The HA harnesses themselves: three Patroni members behind HAProxy fail over when the primary's node crashes, the
 * crashed member rejoins, and nothing is left behind — every process stopped by its group, the temp dir removed.
 */
import { access } from 'node:fs/promises';
import { connect } from 'amqplib';
import { Client } from 'pg';
import { alive, type HaPostgres, startHaPostgres } from '../support/ha-postgres';
import { type RabbitCluster, startRabbitCluster } from '../support/ha-rabbitmq';
import { until } from '../support/until';

const waitFor = (done: () => Promise<boolean>) => until('HAProxy routes to the new leader', 30_000, done, 200);

describe('the PostgreSQL HA harness', () => {
  let cluster: HaPostgres | undefined;
  afterAll(() => cluster?.stop(), 120_000);

  it('starts etcd, three members and HAProxy, fails over on a node crash, rejoins the old primary, and stops everything', async () => {
    const started = Date.now();
    cluster = await startHaPostgres({ synchronous: true });
    const startMs = Date.now() - started;
    const first = await cluster.leader();
    expect(first).toBeDefined();
    const client = new Client({ connectionString: cluster.url });
    await client.connect();
    await client.query('CREATE TABLE kept (id int PRIMARY KEY)');
    await client.query('INSERT INTO kept VALUES (1)');
    await client.end();

    const crashed = Date.now();
    await cluster.crashMember(first!);
    let second: string | undefined;
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline && (second === undefined || second === first)) {
      second = await cluster.leader();
      await new Promise((r) => setTimeout(r, 200));
    }
    const failoverMs = Date.now() - crashed;
    expect(second).toBeDefined();
    expect(second).not.toBe(first);
    await waitFor(async () => (await cluster!.routedTo()).join() === second);
    const after = new Client({ connectionString: cluster.url });
    await after.connect();
    expect((await after.query('SELECT count(*)::int AS n FROM kept')).rows[0].n).toBe(1);
    await after.end();
    await cluster.startMember(first!);
    const rejoined = Date.now();
    await cluster.untilHealthy();
    console.log(
      `ha harness: up in ${startMs} ms, new leader seen ${failoverMs} ms after the crash, rejoined in ${Date.now() - rejoined} ms`,
    );

    const [dir, pids] = [cluster.dir, await cluster.pids()];
    expect(pids.length).toBe(2 + 3 + 3);
    await cluster.stop();
    cluster = undefined;
    await expect(access(dir)).rejects.toThrow();
    expect(pids.filter(alive)).toEqual([]);
  }, 300_000);
});

describe('the RabbitMQ cluster harness', () => {
  let cluster: RabbitCluster | undefined;
  afterAll(() => cluster?.stop(), 120_000);

  it('starts three clustered nodes; a quorum queue keeps every confirmed message when its leader node is killed; stops everything', async () => {
    const started = Date.now();
    cluster = await startRabbitCluster();
    const startMs = Date.now() - started;
    expect((await cluster.runningNodes()).sort()).toEqual(cluster.nodes.map((n) => n.name).sort());
    const queue = 'harness.quorum';
    const publisher = await connect(cluster.nodes[0].url);
    const channel = await publisher.createConfirmChannel();
    await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
    for (let i = 0; i < 200; i++) channel.sendToQueue(queue, Buffer.from(String(i)), { persistent: true });
    await channel.waitForConfirms();
    await publisher.close();

    const leader = await cluster.queueLeader(queue);
    await cluster.killNode(leader);
    const survivor = cluster.nodes[(leader + 1) % 3];
    const consumer = await connect(survivor.url);
    const reader = await consumer.createChannel();
    const seen = new Set<string>();
    await reader.consume(queue, (m) => m && (seen.add(m.content.toString()), reader.ack(m)));
    await until('every message consumed on a survivor', 60_000, () => seen.size === 200, 50);
    await consumer.close();
    expect(await cluster.queueLeader(queue)).not.toBe(leader);
    await cluster.startNode(leader);
    await until('the node rejoined', 60_000, async () => (await cluster!.runningNodes()).length === 3, 250);
    console.log(`rabbitmq cluster harness: up in ${startMs} ms`);

    const [dir, pids] = [cluster.dir, cluster.pids()];
    expect(pids.length).toBe(4);
    await cluster.stop();
    cluster = undefined;
    await expect(access(dir)).rejects.toThrow();
    expect(pids.filter(alive)).toEqual([]);
  }, 300_000);
});
