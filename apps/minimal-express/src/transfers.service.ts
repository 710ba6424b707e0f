import { Injectable, Logger, UnprocessableEntityException } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import type { Repository } from 'typeorm';
import type { CreateTransferDto } from './create-transfer.dto.js';
import { Transfer } from './transfer.entity.js';

/** A single transfer above this is refused: a business outcome, stored under its key and replayed like a success. */
export const SINGLE_TRANSFER_LIMIT_MINOR = 1_000_000;

@Injectable()
export class TransfersService {
  private readonly logger = new Logger('Transfers');

  // Injected as Nest's docs teach: inside an @Idempotent() handler it runs in the claim's transaction.
  constructor(@InjectRepository(Transfer) private readonly transfers: Repository<Transfer>) {}

  async create(clientId: string, dto: CreateTransferDto): Promise<Transfer> {
    const transfer = await this.transfers.save(this.transfers.create({ clientId, toAccount: dto.toAccount, amountMinor: dto.amountMinor }));
    // Checked after the write on purpose: the refusal is stored, and the row above is rolled back with it.
    if (dto.amountMinor > SINGLE_TRANSFER_LIMIT_MINOR) {
      throw new UnprocessableEntityException(`A single transfer may not exceed ${SINGLE_TRANSFER_LIMIT_MINOR} minor units.`);
    }
    await this.recorded(transfer);
    return transfer;
  }

  findOne(clientId: string, id: string): Promise<Transfer | null> {
    return this.transfers.findOneBy({ clientId, id });
  }

  /** After the write, before the answer: where a handler's later work (and a crash of it) happens. */
  recorded(transfer: Transfer): Promise<void> {
    this.logger.log(`transfer ${transfer.id} recorded`);
    return Promise.resolve();
  }
}
