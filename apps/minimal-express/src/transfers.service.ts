import { Injectable, Logger, UnprocessableEntityException } from '@nestjs/common';
import { Database } from '#idempotency';
import type { CreateTransferDto } from './create-transfer.dto.js';
import { Transfer } from './transfer.entity.js';

/** A single transfer above this is refused: a business outcome, stored under its key and replayed like a success. */
export const SINGLE_TRANSFER_LIMIT_MINOR = 1_000_000;

@Injectable()
export class TransfersService {
  private readonly logger = new Logger('Transfers');

  // Database, not @InjectRepository(Transfer): its repositories run in the claim's transaction.
  constructor(private readonly db: Database) {}

  async create(clientId: string, dto: CreateTransferDto): Promise<Transfer> {
    const transfers = this.db.getRepository(Transfer);
    const transfer = await transfers.save(transfers.create({ clientId, toAccount: dto.toAccount, amountMinor: dto.amountMinor }));
    // Checked after the write on purpose: the refusal is stored, and the row above is rolled back with it.
    if (dto.amountMinor > SINGLE_TRANSFER_LIMIT_MINOR) {
      throw new UnprocessableEntityException(`A single transfer may not exceed ${SINGLE_TRANSFER_LIMIT_MINOR} minor units.`);
    }
    await this.recorded(transfer);
    return transfer;
  }

  findOne(clientId: string, id: string): Promise<Transfer | null> {
    return this.db.getRepository(Transfer).findOneBy({ clientId, id });
  }

  /** After the write, before the answer: where a handler's later work (and a crash of it) happens. */
  recorded(transfer: Transfer): Promise<void> {
    this.logger.log({ transferId: transfer.id }, 'transfer recorded');
    return Promise.resolve();
  }
}
