import { Body, Controller, Get, Headers, NotFoundException, Param, ParseUUIDPipe, Post, UseGuards } from '@nestjs/common';
import { Idempotent } from '@idempotent-orders/idempotency';
import { ClientGuard } from './client.guard.js';
import { CreateTransferDto } from './create-transfer.dto.js';
import type { Transfer } from './transfer.entity.js';
import { TransfersService } from './transfers.service.js';

@Controller('transfers')
@UseGuards(ClientGuard)
export class TransfersController {
  constructor(private readonly transfers: TransfersService) {}

  /** Retried with the same Idempotency-Key, the first answer comes back; the transfer is made once. */
  @Post()
  @Idempotent()
  create(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<Transfer> {
    return this.transfers.create(clientId, dto);
  }

  @Get(':id')
  async findOne(@Headers('x-client-id') clientId: string, @Param('id', ParseUUIDPipe) id: string): Promise<Transfer> {
    const transfer = await this.transfers.findOne(clientId, id);
    if (!transfer) throw new NotFoundException('No such transfer.');
    return transfer;
  }
}
