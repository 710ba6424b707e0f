/**
 * The broker harness itself: a real RabbitMQ node starts on its own ports, keeps a durable queue's persistent
 * message across a stop and a start, and leaves nothing behind — its node, its epmd (by pid) and its temp dir.
 */
import { access } from 'node:fs/promises';
import { connect } from 'amqplib';
import { alive, type RabbitMq, startRabbitMq } from '../support/rabbitmq';

describe('the RabbitMQ test harness', () => {
  let broker: RabbitMq | undefined;
  afterAll(() => broker?.stop(), 60_000);

  it('starts a node, keeps a persistent message across a restart, and stops node, epmd and temp dir', async () => {
    broker = await startRabbitMq();
    const queue = 'harness.check';
    const publisher = await connect(broker.url);
    const channel = await publisher.createConfirmChannel();
    await channel.assertQueue(queue, { durable: true });
    channel.sendToQueue(queue, Buffer.from('kept'), { persistent: true, messageId: 'm-1' });
    await channel.waitForConfirms();
    await publisher.close();
    await broker.untilQueueDepth(queue, { ready: 1, unacked: 0 });

    const firstPid = broker.pid();
    await broker.restart();
    expect(broker.pid()).not.toBe(firstPid);
    expect(alive(firstPid!)).toBe(false);

    const consumer = await connect(broker.url);
    const reader = await consumer.createChannel();
    const message = await reader.get(queue, { noAck: false });
    expect(message && message.content.toString()).toBe('kept');
    expect(message && message.properties.messageId).toBe('m-1');
    reader.ack(message as Exclude<typeof message, false>);
    // The channel's close is a round trip behind the ack: the ack has reached the broker when it returns.
    await reader.close();
    await consumer.close();
    await broker.untilQueueDepth(queue, { ready: 0, unacked: 0 });

    const [nodePid, epmdPid, dir] = [broker.pid()!, broker.epmdPid()!, broker.dir];
    await broker.stop();
    broker = undefined;
    expect(alive(nodePid)).toBe(false);
    expect(alive(epmdPid)).toBe(false);
    await expect(access(dir)).rejects.toThrow();
  }, 180_000);
});
