#!/bin/bash
echo lemon > /workspace/memo.txt
